"""Byte-level BPE tokenizer with a chat template for agent traces.

    training-assets train-tokenizer --vocab-size 4096 --json

``train_tokenizer(texts, vocab_size=...)`` trains a GPT-2-style byte-level BPE (Sennrich et al.
2016, "Neural Machine Translation of Rare Words with Subword Units"; byte-level alphabet as in
GPT-2) with Hugging Face ``tokenizers`` and wraps it as a ``PreTrainedTokenizerFast``. Byte-level
means every string, whatever its script or control characters, encodes to some ids and decodes
back to the same string: there is no unknown token and no normalizer.

Special tokens (each one id, never split, never merged by BPE):

- ``<|bos|>`` begins a conversation, ``<|pad|>`` pads batches;
- ``<|end|>`` ends a turn. It is also ``eos_token``, so ``generate()`` stops after an assistant
  turn and ``pack_sequences`` uses it to separate documents;
- role markers ``<|system|> <|user|> <|assistant|> <|tool|>``;
- functional tokens ``<|tool_call|> <|/tool_call|>`` around each call (``{"name": ..,
  "arguments": ..}``) and ``<|tool_result|> <|/tool_result|>`` around each tool result.

The chat template wraps every assistant turn (content, tool calls and its ``<|end|>``) in
``{% generation %}``, so ``apply_chat_template(..., return_assistant_tokens_mask=True)`` marks
exactly the tokens a model should be trained on, the end-of-turn token included (a model that
never sees a loss on ``<|end|>`` never learns to stop).
"""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, field_validator

from training_assets import paths
from training_assets.base_model.template import CHATML_END, CHATML_START, TOOL_TEMPLATE, template_hash, with_tool_template
from training_assets.storage import atomic_dir, sha256_tree, write_json_atomic

# Bump when training settings, special tokens or the template change: it is the asset's code version.
TOKENIZER_VERSION = "1"
CHATML_TOKENS = (CHATML_START, CHATML_END)  # an adopted (ChatML) base's turn markers: one id each
METADATA_FILE = "tokenizer_metadata.json"

BOS, EOS, PAD = "<|bos|>", "<|end|>", "<|pad|>"
ROLE_TOKENS = {"system": "<|system|>", "user": "<|user|>", "assistant": "<|assistant|>", "tool": "<|tool|>"}
TOOL_CALL_OPEN, TOOL_CALL_CLOSE = "<|tool_call|>", "<|/tool_call|>"
TOOL_RESULT_OPEN, TOOL_RESULT_CLOSE = "<|tool_result|>", "<|/tool_result|>"
FUNCTIONAL_TOKENS = (TOOL_CALL_OPEN, TOOL_CALL_CLOSE, TOOL_RESULT_OPEN, TOOL_RESULT_CLOSE)
# Order fixes the ids: pad=0, bos=1, end=2, then roles, then functional tokens.
SPECIAL_TOKENS: tuple[str, ...] = (PAD, BOS, EOS, *ROLE_TOKENS.values(), *FUNCTIONAL_TOKENS)

# Every assistant turn (text, tool calls, end-of-turn) is inside {% generation %}: those are the
# tokens `return_assistant_tokens_mask=True` marks. Tool-call arguments are OpenAI JSON text and
# are written as they are; a mapping (the HF convention) is serialised with sorted keys.
CHAT_TEMPLATE = (
    "{{- bos_token -}}"
    "{%- if tools -%}"
    "{{- '<|system|>Available tools: ' + (tools | tojson) + '<|end|>' -}}"
    "{%- endif -%}"
    "{%- for message in messages -%}"
    "{%- if message['role'] == 'assistant' -%}"
    "{{- '<|assistant|>' -}}"
    "{%- generation -%}"
    "{%- if message.get('content') -%}{{- message['content'] -}}{%- endif -%}"
    "{%- for call in message.get('tool_calls') or [] -%}"
    "{%- set fn = call['function'] if call.get('function') else call -%}"
    "{%- set args = fn.get('arguments', {}) -%}"
    "{{- '<|tool_call|>{\"name\": ' + (fn['name'] | tojson) + ', \"arguments\": ' -}}"
    "{%- if args is string -%}{{- args -}}{%- else -%}{{- args | tojson(sort_keys=true) -}}{%- endif -%}"
    "{{- '}<|/tool_call|>' -}}"
    "{%- endfor -%}"
    "{{- '<|end|>' -}}"
    "{%- endgeneration -%}"
    "{%- elif message['role'] == 'tool' -%}"
    "{{- '<|tool|><|tool_result|>' + (message.get('content') or '') + '<|/tool_result|><|end|>' -}}"
    "{%- else -%}"
    "{{- '<|' + message['role'] + '|>' + (message.get('content') or '') + '<|end|>' -}}"
    "{%- endif -%}"
    "{%- endfor -%}"
    "{%- if add_generation_prompt -%}{{- '<|assistant|>' -}}{%- endif -%}"
)

# Text that breaks careless tokenizers: scripts, emoji (ZWJ sequences, flags, skin tones),
# combining marks, code, whitespace runs, control characters, lone surrogate-free oddities, and
# literal special-token look-alikes that must stay text.
HARD_TEXTS: tuple[str, ...] = (
    "Grüße aus Köln — naïve café, Straße, ÆØÅ æøå",
    "日本語のテキスト、中文文本，한국어 텍스트",
    "Привет, мир! Ελληνικά. עברית ושלום. العربية مرحبا",
    "हिन्दी पाठ, ภาษาไทย, ქართული",
    "emoji 👩‍👩‍👧‍👦 🇩🇪 👍🏽 🧪✨ and text",
    "e\u0301 vs é, Å vs A\u030a, ﬁ ligature, \u200b zero width",
    "def f(x):\n\tif x:\n\t\treturn {'a': [1, 2]}  # comment\n\n\n    return None\n",
    "    leading spaces,\ttabs,   runs   of   spaces     and trailing   ",
    "\n\n\n\r\n\r\n",
    "control\x00nul\x01\x07bell\x1b[31mred\x1b[0m\x7fdel\x0b\x0c",
    "literal <|end|> and <|assistant|> typed by a user, <bos>, </s>, [INST]",
    '{"name": "calculator", "arguments": {"expression": "12 * 7 + 3"}}',
    "a" * 300 + " " + "ab" * 150,
    "",
    " ",
)


class TokenizerConfig(BaseModel):
    """Settings of one tokenizer training run: their one declaration (default and help per field); the
    ``tokenizer`` asset's run config and the ``train-tokenizer`` options derive from it."""

    model_config = ConfigDict(frozen=True, extra="forbid")
    vocab_size: int = Field(2048, description=(
        "Vocabulary size (bytes + special tokens + merges), at least 512. Small for the CPU demo."))
    min_frequency: int = Field(2, ge=1, description="A symbol pair seen fewer times is never merged.")
    max_chars: int = Field(50_000_000, ge=1, description="Training text is cut after this many characters (memory bound).")
    held_back_fraction: float = Field(0.05, ge=0.0, lt=1.0, description=(
        "Share of corpus rows kept out of training for the round-trip check."))
    seed: int = Field(0, description="Picks the held-back rows.")

    def __init__(self, *args: Any, **values: Any) -> None:
        # positional, in field order, as the dataclass this model replaces took them: TokenizerConfig(4096)
        super().__init__(**dict(zip(type(self).model_fields, args, strict=False)), **values)

    @field_validator("vocab_size")
    @classmethod
    def _above_the_fixed_symbols(cls, vocab_size: int) -> int:
        floor = 256 + len(SPECIAL_TOKENS)
        if vocab_size <= floor:
            raise ValueError(f"vocab_size {vocab_size} must exceed {floor} (256 byte symbols + "
                             f"{len(SPECIAL_TOKENS)} special tokens); use at least 512")
        return vocab_size


def _texts_up_to(texts: Iterable[str], max_chars: int) -> Iterable[str]:
    used = 0
    for text in texts:
        if used >= max_chars:
            return
        yield text[: max_chars - used]
        used += len(text)


def train_tokenizer(texts: Iterable[str], vocab_size: int = 2048, config: TokenizerConfig | None = None):
    """Train a byte-level BPE on ``texts``; returns a ``PreTrainedTokenizerFast`` with the chat template.

    ``config`` (when given) holds every setting and overrides ``vocab_size``. The vocabulary can
    come out smaller than ``vocab_size`` when the texts hold fewer distinct mergeable pairs.

    Deterministic for the same texts and settings (merge ties are broken by the pair, not by
    hash order), so the saved files are byte-identical across runs.
    """
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers  # the train extra: only when training one

    config = config or TokenizerConfig(vocab_size=vocab_size)
    core = Tokenizer(models.BPE())
    # ByteLevel with the GPT-2 split regex: words never merge across spaces/punctuation classes.
    # No add_prefix_space: "hi" and " hi" stay distinct, and decode(encode(s)) == s exactly.
    core.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    core.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=config.vocab_size,
        min_frequency=config.min_frequency,
        special_tokens=list(SPECIAL_TOKENS),
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),  # all 256 bytes: nothing is unknown
        show_progress=False,
    )
    core.train_from_iterator(_texts_up_to(texts, config.max_chars), trainer=trainer)
    return wrap_tokenizer(core)


def wrap_tokenizer(core: Any):
    """Wrap a ``tokenizers.Tokenizer`` holding ``SPECIAL_TOKENS`` as a transformers tokenizer."""
    from transformers import PreTrainedTokenizerFast  # the train extra: torch-side, ~2 s, only when a tokenizer is used

    missing = [t for t in SPECIAL_TOKENS if core.token_to_id(t) is None]
    if missing:
        raise ValueError(f"tokenizer lacks special tokens {missing}; train it with train_tokenizer")
    return PreTrainedTokenizerFast(
        tokenizer_object=core,
        bos_token=BOS,
        eos_token=EOS,
        pad_token=PAD,
        additional_special_tokens=[t for t in SPECIAL_TOKENS if t not in (BOS, EOS, PAD)],
        chat_template=CHAT_TEMPLATE,
        clean_up_tokenization_spaces=False,  # the default would rewrite " ." to "." on decode
        model_max_length=1 << 20,
    )


# --------------------------------------------------------------------------- checks


def round_trip_failures(tokenizer: Any, texts: Sequence[str]) -> list[dict[str, Any]]:
    """Texts whose ``decode(encode(text))`` is not ``text``, each with its index and the first bad offset."""
    failures = []
    for index, text in enumerate(texts):
        ids = tokenizer.encode(text, add_special_tokens=False)
        back = tokenizer.decode(ids, skip_special_tokens=False, clean_up_tokenization_spaces=False)
        if back != text:
            at = next((i for i, (a, b) in enumerate(zip(text, back, strict=False)) if a != b), min(len(text), len(back)))
            failures.append({"index": index, "offset": at, "expected": text[at:at + 20], "got": back[at:at + 20]})
    return failures


def special_token_failures(tokenizer: Any, tokens: Sequence[str] = SPECIAL_TOKENS) -> list[dict[str, Any]]:
    """Special tokens that do not encode to exactly one id (or whose id does not decode back)."""
    failures = []
    for token in tokens:
        ids = tokenizer.encode(token, add_special_tokens=False)
        if len(ids) != 1 or tokenizer.convert_ids_to_tokens(ids[0]) != token:
            failures.append({"token": token, "ids": ids})
    return failures


def end_of_turn_masked(tokenizer: Any, end: str = EOS, turn_marker: str = ROLE_TOKENS["assistant"]) -> tuple[bool, str]:
    """Whether ``end`` closing an assistant turn lies inside the assistant mask, with the reason
    (``turn_marker``, the token that opens the assistant turn, must lie outside it)."""
    conversation = [
        {"role": "user", "content": "What is 2 + 2?"},
        {"role": "assistant", "content": "Let me compute.", "tool_calls": [
            {"id": "c1", "type": "function", "function": {"name": "calculator", "arguments": '{"expression": "2 + 2"}'}}]},
        {"role": "tool", "tool_call_id": "c1", "content": "4"},
        {"role": "assistant", "content": "The answer is 4."},
    ]
    out = tokenizer.apply_chat_template(conversation, tokenize=True, return_dict=True, return_assistant_tokens_mask=True)
    ids, mask = out["input_ids"], out["assistant_masks"]
    end_id = tokenizer.convert_tokens_to_ids(end)
    assistant_id = tokenizer.convert_tokens_to_ids(turn_marker)
    ends = [i for i, t in enumerate(ids) if t == end_id]
    masked_ends = [e for e in ends if mask[e]]
    if len(masked_ends) != 2:
        return False, f"{len(masked_ends)} of the 2 assistant end-of-turn tokens are in the mask (ends at {ends}, mask {mask})"
    if any(mask[i] for i, t in enumerate(ids) if t == assistant_id):
        return False, f"the {turn_marker} role marker is in the mask; only the turn's content should be"
    return True, f"both assistant turns end with {end} inside the mask; role markers are outside it"


def bytes_per_token(tokenizer: Any, texts: Sequence[str]) -> float:
    """UTF-8 bytes per token over ``texts`` (higher = better compression)."""
    n_bytes = sum(len(t.encode("utf-8")) for t in texts)
    n_tokens = sum(len(ids) for ids in tokenizer(list(texts), add_special_tokens=False)["input_ids"]) if texts else 0
    return n_bytes / n_tokens if n_tokens else 0.0


# --------------------------------------------------------------------------- files


def split_held_back(ids: Sequence[str], fraction: float, seed: int) -> set[str]:
    """A deterministic sample of row ids kept out of training (chosen by hash, not by order)."""
    if fraction <= 0:
        return set()
    ranked = sorted(ids, key=lambda i: hashlib.sha256(f"{seed}\x1f{i}".encode()).hexdigest())
    n = max(1, round(len(ranked) * fraction)) if len(ranked) > 1 else 0
    return set(ranked[:n])


def chat_template_hash(tokenizer: Any) -> str:
    """Short hash of the tokenizer's chat template text."""
    return hashlib.sha256((tokenizer.chat_template or "").encode()).hexdigest()[:16]


def tokenizer_dir(root: str | os.PathLike[str] | None = None) -> Path:
    return paths.asset_dir("tokenizer", root)


def load_tokenizer(root: str | os.PathLike[str] | None = None):
    """The ``tokenizer`` asset as a ``PreTrainedTokenizerFast``.

    ``AutoTokenizer.from_pretrained(folder)`` gives the same object; this path skips importing
    torch, which AutoTokenizer does (seconds on a busy machine).
    """
    folder = tokenizer_dir(root)
    if not (folder / "tokenizer.json").is_file():
        raise FileNotFoundError(f"no tokenizer under {folder}; materialise the `tokenizer` asset or run "
                                "`training-assets train-tokenizer`")
    return _load_folder(folder)


def tokenizer_hash(root: str | os.PathLike[str] | None = None) -> str:
    """Content hash of the tokenizer files (template included), without the metadata file."""
    folder = tokenizer_dir(root)
    if not (folder / "tokenizer.json").is_file():
        raise FileNotFoundError(f"no tokenizer under {folder}; materialise the `tokenizer` asset first")
    return _hash_without_metadata(folder)


# --------------------------------------------------------------------------- the asset's work


@dataclass
class TokenizerReport:
    output_dir: Path
    tokenizer_hash: str
    chat_template_hash: str
    key: dict[str, Any]
    reused: bool
    vocab_size: int
    n_train_rows: int
    n_held_back_rows: int
    bytes_per_token: float
    round_trip_failures: list[dict[str, Any]] = field(default_factory=list)
    hard_text_failures: list[dict[str, Any]] = field(default_factory=list)
    special_token_failures: list[dict[str, Any]] = field(default_factory=list)
    end_of_turn_masked: tuple[bool, str] = (False, "")


def tokenizer_key(corpus_version: str, config: TokenizerConfig) -> dict[str, Any]:
    """What a trained tokenizer depends on: (corpus version, config, tokenizer code version)."""
    return {"corpus_version": corpus_version, "config": config.model_dump(), "code_version": TOKENIZER_VERSION}


def _reusable(output_dir: Path, key: dict[str, Any]) -> bool:
    previous = _read_metadata(output_dir)
    return bool(previous and previous.get("key") == key and (output_dir / "tokenizer.json").is_file()
                and previous.get("tokenizer_hash") == _hash_without_metadata(output_dir))


def plan_tokenizer(rows: Sequence[dict[str, str]], corpus_version: str, config: TokenizerConfig,
                   output_dir: Path) -> dict[str, Any]:
    """What ``build_tokenizer`` would do, without training: the key, whether the existing folder
    would be reused, and the rows and characters it would train on (``max_chars`` applied)."""
    key = tokenizer_key(corpus_version, config)
    held_back = split_held_back([r["id"] for r in rows], config.held_back_fraction, config.seed)
    chars = sum(len(r["text"]) for r in rows if r["id"] not in held_back)
    return {"output_dir": str(output_dir), "key": key, "would_reuse": _reusable(output_dir, key),
            "vocab_size": config.vocab_size, "min_frequency": config.min_frequency,
            "train_rows": len(rows) - len(held_back), "held_back_rows": len(held_back),
            "corpus_chars": chars, "train_chars": min(chars, config.max_chars)}


def build_tokenizer(
    rows: Sequence[dict[str, str]], corpus_version: str, config: TokenizerConfig, output_dir: Path
) -> TokenizerReport:
    """Train (or reuse, when the key is unchanged) the tokenizer on corpus ``rows`` ({id, text}) and run its checks.

    The key is (corpus version, config, tokenizer code version): the same key with intact files
    reuses the folder instead of retraining.
    """
    key = tokenizer_key(corpus_version, config)
    held_back = split_held_back([r["id"] for r in rows], config.held_back_fraction, config.seed)
    train_rows = [r for r in rows if r["id"] not in held_back]
    held_texts = [r["text"] for r in rows if r["id"] in held_back]
    reused = _reusable(output_dir, key)
    if reused:
        tokenizer = _load_folder(output_dir)
    else:
        if not train_rows:
            raise ValueError("the curated corpus has no rows to train a tokenizer on; materialise curated_corpus "
                             "with some traces first")
        tokenizer = train_tokenizer((r["text"] for r in train_rows), config=config)
        with atomic_dir(output_dir) as tmp:
            tokenizer.save_pretrained(tmp)
            metadata = {"key": key, "tokenizer_hash": _hash_without_metadata(tmp),
                        "chat_template_hash": chat_template_hash(tokenizer), "special_tokens": list(SPECIAL_TOKENS)}
            write_json_atomic(Path(tmp) / METADATA_FILE, metadata)
    sample = held_texts or [r["text"] for r in train_rows[:50]]
    return TokenizerReport(
        output_dir=output_dir,
        tokenizer_hash=_hash_without_metadata(output_dir),
        chat_template_hash=chat_template_hash(tokenizer),
        key=key,
        reused=reused,
        vocab_size=len(tokenizer),
        n_train_rows=len(train_rows),
        n_held_back_rows=len(held_texts),
        bytes_per_token=round(bytes_per_token(tokenizer, sample), 4),
        round_trip_failures=round_trip_failures(tokenizer, sample),
        hard_text_failures=round_trip_failures(tokenizer, HARD_TEXTS),
        special_token_failures=special_token_failures(tokenizer),
        end_of_turn_masked=end_of_turn_masked(tokenizer),
    )


def adopt_tokenizer(base_folder: str | os.PathLike[str], base_hash: str, rows: Sequence[dict[str, str]],
                    config: TokenizerConfig, output_dir: Path) -> TokenizerReport:
    """The tokenizer of a pretrained base (no new BPE, no resize), with the tool-call template of
    ``base_model.template``, saved to ``output_dir`` and checked like a trained one: the corpus's
    held-back rows and the hard texts round-trip, the ChatML markers are one id each, and the
    end-of-turn closing each assistant turn is inside the loss mask. Reused while the base and
    the template are unchanged."""
    key = {"base_model": base_hash, "template": template_hash(TOOL_TEMPLATE), "version": TOKENIZER_VERSION}
    held_back = split_held_back([r["id"] for r in rows], config.held_back_fraction, config.seed)
    held_texts = [r["text"] for r in rows if r["id"] in held_back]
    reused = _reusable(output_dir, key)
    if reused:
        tokenizer = _load_folder(output_dir)
    else:
        tokenizer = with_tool_template(_load_folder(Path(base_folder)))
        with atomic_dir(output_dir) as tmp:
            tokenizer.save_pretrained(tmp)
            write_json_atomic(Path(tmp) / METADATA_FILE, {
                "key": key, "tokenizer_hash": _hash_without_metadata(tmp), "chat_template_hash": chat_template_hash(tokenizer),
                "special_tokens": list(CHATML_TOKENS), "base_model": str(base_folder)})
    sample = held_texts or [r["text"] for r in rows[:50]]
    return TokenizerReport(
        output_dir=output_dir, tokenizer_hash=_hash_without_metadata(output_dir),
        chat_template_hash=chat_template_hash(tokenizer), key=key, reused=reused, vocab_size=len(tokenizer),
        n_train_rows=0, n_held_back_rows=len(held_texts), bytes_per_token=round(bytes_per_token(tokenizer, sample), 4),
        round_trip_failures=round_trip_failures(tokenizer, sample),
        hard_text_failures=round_trip_failures(tokenizer, HARD_TEXTS),
        special_token_failures=special_token_failures(tokenizer, CHATML_TOKENS),
        end_of_turn_masked=end_of_turn_masked(tokenizer, CHATML_END, CHATML_START),
    )


def _load_folder(folder: Path):
    from transformers import PreTrainedTokenizerFast  # the train extra: torch-side, ~2 s, only when a tokenizer is used

    return PreTrainedTokenizerFast.from_pretrained(str(folder))


def _read_metadata(folder: Path) -> dict[str, Any] | None:
    path = Path(folder) / METADATA_FILE
    return json.loads(path.read_text(encoding="utf-8")) if path.is_file() else None


def _hash_without_metadata(folder: Path) -> str:
    digest = hashlib.sha256()
    for child in sorted(p for p in Path(folder).rglob("*") if p.is_file() and p.name != METADATA_FILE):
        digest.update(child.relative_to(folder).as_posix().encode() + b"\0" + sha256_tree(child).encode())
    return digest.hexdigest()[:16]
