"""The four datasets on the sample data: contracts, checks, determinism, reuse, readers, Dagster, CLI."""

import json
import shutil

import pyarrow.parquet as pq
import pytest

from training_assets import cli, tokenizer_trainer
from training_assets.storage import sha256_file
from training_assets.training_data import (
    builders,
    dataset_path,
    load_grpo_groups,
    load_preference_pairs,
    load_pretrain_windows,
    load_selection_decisions,
    load_sft_dataset,
    selection_version,
)

BUILDERS = {
    "sft_dataset": builders.build_sft_dataset,
    "preference_pairs": builders.build_preference_dataset,
    "grpo_groups": builders.build_grpo_dataset,
    "pretrain_windows": builders.build_pretrain_dataset,
}
COLUMNS = {
    "sft_dataset": {"id", "task_id", "messages", "input_ids", "assistant_mask", "n_tokens", "source_batches"},
    "preference_pairs": {"id", "task_id", "prompt", "chosen", "rejected", "failure_point", "source_batches"},
    "grpo_groups": {"group_id", "prompt", "completions", "rewards", "advantages", "expected_answer", "source_batches"},
    "pretrain_windows": {"input_ids", "position_ids", "doc_ids", "labels", "source_batches"},
}


@pytest.fixture(scope="module")
def built(sample_root, tmp_path_factory):
    """A private copy of the sample root with all four datasets built once."""
    root = tmp_path_factory.mktemp("built") / "data"
    shutil.copytree(sample_root, root)
    return root, {name: build(root) for name, build in BUILDERS.items()}


def test_every_dataset_is_non_empty_passes_its_checks_and_keeps_the_contract(built):
    root, reports = built
    for name, report in reports.items():
        assert report.info.rows > 0, name
        assert [c.name for c in report.checks if not c.passed] == [], name
        assert COLUMNS[name] <= set(pq.read_schema(dataset_path(name, root)).names)
    sft = load_sft_dataset(root)
    assert all(len(r["input_ids"]) == len(r["assistant_mask"]) == r["n_tokens"] and 0 < sum(r["assistant_mask"]) < r["n_tokens"]
               for r in sft)
    assert all(json.loads(r["chosen"]) != json.loads(r["rejected"]) for r in load_preference_pairs(root))
    assert all(abs(sum(g["advantages"])) < 1e-6 and len(set(g["rewards"])) > 1 for g in load_grpo_groups(root))
    windows = load_pretrain_windows(root)
    assert len({len(w["input_ids"]) for w in windows}) == 1


def test_held_out_tasks_planted_in_the_traces_do_not_reach_any_dataset(built):
    root, reports = built
    held = {e.text for e in builders.held_out_lib.held_out_examples(root)}
    texts = [r["messages"] for r in load_sft_dataset(root)] + [r["prompt"] for r in load_grpo_groups(root)]
    assert not [t for t in texts for h in held if h in t]
    decisions = load_selection_decisions(root).to_pylist()
    contaminated = {d["trace_id"] for d in decisions if d["reason"] == "held_out_overlap"}
    assert len(contaminated) == 2 and not any(d["kept"] for d in decisions if d["trace_id"] in contaminated)
    used = {r["id"] for r in load_sft_dataset(root)} | {i for r in load_preference_pairs(root) for i in r["id"].split(">")}
    assert not used & contaminated
    assert reports["sft_dataset"].info.key["selected_traces_version"] == selection_version(root)


def test_same_inputs_give_byte_identical_files_and_versions(built, sample_root, tmp_path):
    root, reports = built
    other = tmp_path / "data"
    shutil.copytree(sample_root, other)
    for name, build in BUILDERS.items():
        again = build(other)
        assert not again.reused
        assert sha256_file(dataset_path(name, other)) == sha256_file(dataset_path(name, root)), name
        assert again.data_version == reports[name].data_version, name


def test_unchanged_key_reuses_and_changed_config_or_tokenizer_gives_new_version(built, tmp_path):
    root, reports = built
    assert builders.build_grpo_dataset(root).reused
    dr_grpo = builders.build_grpo_dataset(root, builders.GrpoConfig(scale_rewards="none"))
    assert not dr_grpo.reused and dr_grpo.data_version != reports["grpo_groups"].data_version
    assert dr_grpo.info.key["config"]["scale_rewards"] == "none"
    # a damaged file is rebuilt, not trusted
    dataset_path("pretrain_windows", root).write_bytes(b"not parquet")
    assert not builders.build_pretrain_dataset(root).reused
    # a new tokenizer changes the key of the tokenised datasets
    key_before = reports["sft_dataset"].info.key
    rows = [{"id": str(i), "text": r["messages"]} for i, r in enumerate(load_sft_dataset(root))]
    tokenizer_trainer.build_tokenizer(rows, "other-corpus", tokenizer_trainer.TokenizerConfig(vocab_size=700),
                                      tokenizer_trainer.tokenizer_dir(root))
    rebuilt = builders.build_sft_dataset(root)
    assert not rebuilt.reused and rebuilt.info.key["tokenizer_hash"] != key_before["tokenizer_hash"]
    assert rebuilt.info.key["chat_template_hash"] == key_before["chat_template_hash"]


def test_parquet_is_readable_by_polars_and_hf_datasets(built):
    import polars as pl
    from datasets import load_dataset

    root, _ = built
    for name in BUILDERS:
        path = str(dataset_path(name, root))
        frame = pl.read_parquet(path)
        hf = load_dataset("parquet", data_files=path, split="train")
        assert frame.height == hf.num_rows > 0 and set(frame.columns) == set(hf.column_names)
    sft = load_dataset("parquet", data_files=str(dataset_path("sft_dataset", root)), split="train")
    assert isinstance(sft[0]["input_ids"], list) and isinstance(sft[0]["input_ids"][0], int)


def test_cli_builds_a_dataset_and_reports_json(built, capsys):
    root, reports = built
    code = cli.main(["build-dataset", "dpo", "--root", str(root), "--json"])
    payload = json.loads(capsys.readouterr().out)
    assert code == 0 and payload["dataset"] == "preference_pairs"
    assert payload["data_version"] == reports["preference_pairs"].data_version and payload["reused"]
    assert all(c["passed"] for c in payload["checks"].values())


def test_cli_explains_a_missing_tokenizer(tmp_path, capsys):
    code = cli.main(["build-dataset", "sft", "--root", str(tmp_path)])
    assert code == 2 and "tokenizer" in capsys.readouterr().err


def test_cli_plans_the_tokenizer_then_trains_it_with_execute_and_reuses_it(built, capsys):
    root, _ = built
    before = tokenizer_trainer.tokenizer_hash(root)
    assert cli.main(["train-tokenizer", "--root", str(root), "--vocab-size", "800", "--json"]) == 0
    plan = json.loads(capsys.readouterr().out)["plan"]
    assert not plan["would_reuse"] and plan["vocab_size"] == 800 and plan["train_rows"] > 0
    assert plan["train_chars"] <= plan["corpus_chars"] and plan["key"]["config"]["vocab_size"] == 800
    assert tokenizer_trainer.tokenizer_hash(root) == before  # planning trained nothing
    code = cli.main(["train-tokenizer", "--root", str(root), "--vocab-size", "800", "--execute", "--json"])
    first = json.loads(capsys.readouterr().out)
    assert code == 0 and all(first["checks"].values()) and not first["reused"] and first["vocab_size"] <= 800
    assert cli.main(["train-tokenizer", "--root", str(root), "--vocab-size", "800", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["plan"]["would_reuse"]
    assert cli.main(["train-tokenizer", "--root", str(root), "--vocab-size", "800", "--execute", "--json"]) == 0
    second = json.loads(capsys.readouterr().out)
    assert second["reused"] and second["tokenizer_hash"] == first["tokenizer_hash"]


def test_held_out_overlap_check_catches_a_prompt_inside_json_messages(built):
    root, _ = built
    held = builders.held_out_lib.held_out_examples(root)
    leaked = json.dumps([{"role": "user", "content": held[0].text}, {"role": "assistant", "content": "ok"}])
    outcome = builders.held_out_overlap_check({"leak": builders.messages_plain_text(leaked), "fine": "nothing shared"}, held)
    assert not outcome.passed and [o["id"] for o in outcome.details["overlaps"]] == ["leak"]


def test_cli_select_traces_reports_every_decision(built, capsys):
    root, reports = built
    assert cli.main(["select-traces", "--root", str(root), "--json"]) == 0
    payload = json.loads(capsys.readouterr().out)
    assert payload["data_version"] == reports["sft_dataset"].info.key["selected_traces_version"]  # same inputs
    assert payload["counts"]["kept"] + payload["counts"]["dropped"] == payload["counts"]["traces"]
    assert payload["by_reason"]["decontaminate/held_out_overlap (dropped)"] == 2
