"""tokenizer: byte-level BPE on the curated corpus, saved as a Hugging Face tokenizer folder.

Its run config derives from ``tokenizer_trainer.TokenizerConfig`` (each field's default and help declared there once).
"""

import dagster as dg

from training_assets import data_engine, tokenizer_trainer
from training_assets.base_model.selection import current_base_model
from training_assets.defs.automation import POLICY, tokenizer_condition
from training_assets.defs.metadata import table
from training_assets.defs.resources import DataRoot
from training_assets.defs.settings import spec_config

ROUND_TRIP_CHECK = "round_trip_lossless"
HARD_TEXT_CHECK = "round_trip_hard_text"
SPECIAL_TOKENS_CHECK = "special_tokens_single_id"
END_OF_TURN_CHECK = "end_of_turn_in_assistant_mask"


# every TokenizerConfig field, with the library's defaults (the library's are already the demo's)
TokenizerAssetConfig = spec_config("TokenizerAssetConfig", tokenizer_trainer.TokenizerConfig)


def _check(name: str, failures: list, ok_text: str, bad_text: str) -> dg.AssetCheckResult:
    return dg.AssetCheckResult(check_name=name, passed=not failures, severity=dg.AssetCheckSeverity.ERROR,
                               metadata={"failures": table(failures[:10])} if failures else {},
                               description=ok_text if not failures else bad_text)


@dg.asset(
    group_name="tokenizer", code_version=tokenizer_trainer.TOKENIZER_VERSION, kinds={"huggingface"},
    automation_condition=tokenizer_condition(POLICY),
    deps=["curated_corpus", "base_model"],
    check_specs=[
        dg.AssetCheckSpec(ROUND_TRIP_CHECK, asset="tokenizer", blocking=True,
                          description="decode(encode(text)) == text on corpus rows held back from training."),
        dg.AssetCheckSpec(HARD_TEXT_CHECK, asset="tokenizer", blocking=True,
                          description="Lossless round trip on scripts, emoji, code, whitespace runs, control characters."),
        dg.AssetCheckSpec(SPECIAL_TOKENS_CHECK, asset="tokenizer", blocking=True,
                          description="Every special and functional token encodes to exactly one id."),
        dg.AssetCheckSpec(END_OF_TURN_CHECK, asset="tokenizer", blocking=True,
                          description="The end-of-turn token closing each assistant turn is inside the assistant loss mask."),
    ],
)
def tokenizer(context: dg.AssetExecutionContext, config: TokenizerAssetConfig, data_root: DataRoot) -> dg.MaterializeResult:
    """Byte-level BPE with special, role and tool tokens and a chat template with assistant masks.

    Retrained only when the corpus version or the config changes (else the folder is reused). When
    ``base_model`` names a pretrained model, its own tokenizer is adopted instead (no new BPE), with
    the tool-call template, and checked the same way.
    """
    root = data_root.root()
    rows = data_engine.load_curated_corpus(root).select(["id", "text"]).to_pylist()
    settings, out = tokenizer_trainer.TokenizerConfig(**config.model_dump()), tokenizer_trainer.tokenizer_dir(root)
    base = current_base_model(root)
    if base is not None and base.folder:
        report = tokenizer_trainer.adopt_tokenizer(base.folder, base.model_hash, rows, settings, out)
    else:
        report = tokenizer_trainer.build_tokenizer(rows, data_engine.corpus_version(root), settings, out)
    context.log.info(f"tokenizer {report.tokenizer_hash}: vocab {report.vocab_size}, reused={report.reused}")
    eot_ok, eot_reason = report.end_of_turn_masked
    return dg.MaterializeResult(
        metadata={
            "vocab_size": report.vocab_size,
            "bytes_per_token": report.bytes_per_token,
            "train_rows": report.n_train_rows,
            "held_back_rows": report.n_held_back_rows,
            "special_tokens": table([{"token": t} for t in (tokenizer_trainer.CHATML_TOKENS if base and base.folder
                                                              else tokenizer_trainer.SPECIAL_TOKENS)]),
            "tokenizer_hash": report.tokenizer_hash,
            "chat_template_hash": report.chat_template_hash,
            "reused": report.reused,
            "key": dg.MetadataValue.json(report.key),
            "uri": dg.MetadataValue.path(str(report.output_dir)),
        },
        data_version=dg.DataVersion(report.tokenizer_hash),
        check_results=[
            _check(ROUND_TRIP_CHECK, report.round_trip_failures, f"{report.n_held_back_rows} held-back rows round-trip exactly",
                   f"{len(report.round_trip_failures)} held-back rows do not round-trip"),
            _check(HARD_TEXT_CHECK, report.hard_text_failures, f"all {len(tokenizer_trainer.HARD_TEXTS)} hard texts round-trip exactly",
                   f"{len(report.hard_text_failures)} hard texts do not round-trip"),
            _check(SPECIAL_TOKENS_CHECK, report.special_token_failures, "every special token is one id",
                   f"{len(report.special_token_failures)} special tokens split into several ids"),
            _check(END_OF_TURN_CHECK, [] if eot_ok else [{"reason": eot_reason}], eot_reason, eot_reason),
        ],
    )
