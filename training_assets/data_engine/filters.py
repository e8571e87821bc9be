"""Normalisation and quality filters.

A filter is a small function ``text -> True | (False, reason)`` (the datatrove shape): the reason
becomes the record's drop reason and a stats key. ``quality_filter`` runs the configured filters
in order and stops at the first that drops. Thresholds follow the Gopher rules (Rae et al. 2021,
"Scaling Language Models", appendix A.1) where they apply; repetition rules only judge
documents long enough for repetition to mean something (``min_words_for_repetition``).
``QualityConfig`` is the thresholds' one declaration (default and help per field): the
``curated_corpus`` run config and the ``curate`` options derive from it.
"""

from __future__ import annotations

import re
import unicodedata
from collections import Counter
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

from pydantic import BaseModel, ConfigDict, Field

FilterResult = bool | tuple[bool, str]
Filter = Callable[[str], FilterResult]

_UNICODE_SPACE = re.compile(r"[^\S\n]+")  # any whitespace except newline (NBSP, tabs, ...)
_MANY_NEWLINES = re.compile(r"\n{3,}")
_CONTROL = re.compile(r"[\x00-\x08\x0b-\x1f\x7f-\x9f]")  # Unicode category Cc except \t and \n


def normalize(text: str) -> str:
    """Unicode NFC, control characters removed, runs of spaces collapsed to one, line ends kept.

    ``\\r\\n`` and ``\\r`` become ``\\n``; at most one blank line in a row; leading and trailing
    whitespace of every line and of the text is stripped. Idempotent: ``normalize(normalize(t)) ==
    normalize(t)``.
    """
    text = unicodedata.normalize("NFC", text).replace("\r\n", "\n").replace("\r", "\n")
    text = _CONTROL.sub("", text)
    lines = [_UNICODE_SPACE.sub(" ", line).strip() for line in text.split("\n")]
    return _MANY_NEWLINES.sub("\n\n", "\n".join(lines)).strip()


class QualityConfig(BaseModel):
    """Thresholds of the quality filters (defaults keep ordinary agent traces and prose)."""

    model_config = ConfigDict(frozen=True, extra="forbid")
    min_chars: int = Field(20, ge=0, description="Shorter records are dropped (not a training document).")
    max_chars: int = Field(200_000, ge=1, description="Longer records are dropped (almost always a dump: logs, minified files).")
    min_alnum_ratio: float = Field(0.5, ge=0.0, le=1.0, description=(
        "Lowest share of non-space characters that are letters or digits."))
    max_symbol_word_ratio: float = Field(0.1, ge=0.0, description="Gopher: most '#' and '...' per word.")
    max_duplicate_line_fraction: float = Field(0.3, ge=0.0, le=1.0, description=(
        "Gopher: highest share of lines that repeat an earlier line (documents of 4+ lines)."))
    max_top_ngram_fraction: tuple[float, float, float] = Field((0.2, 0.18, 0.16), description=(
        "Gopher: highest share of word characters the most frequent 2-, 3- and 4-gram may cover."))
    max_duplicate_5gram_fraction: float = Field(0.15, ge=0.0, le=1.0, description=(
        "Gopher: highest share of word characters inside repeated 5-grams."))
    min_words_for_repetition: int = Field(50, ge=0, description=(
        "The n-gram repetition rules judge only documents of at least this many words (noise on shorter ones)."))
    max_non_text_fraction: float = Field(0.05, ge=0.0, le=1.0, description=(
        "Highest share of control, private-use or unassigned characters and U+FFFD."))
    max_blob_fraction: float = Field(0.5, ge=0.0, le=1.0, description=(
        "Highest share of characters in whitespace-free tokens of at least blob_token_chars (encoded blobs)."))
    blob_token_chars: int = Field(64, ge=1, description="A whitespace-free token this long counts as a blob.")


def length_filter(cfg: QualityConfig) -> Filter:
    def check(text: str) -> FilterResult:
        if len(text) < cfg.min_chars:
            return False, f"too_short: {len(text)} chars < {cfg.min_chars}"
        if len(text) > cfg.max_chars:
            return False, f"too_long: {len(text)} chars > {cfg.max_chars}"
        return True
    return check


def alnum_filter(cfg: QualityConfig) -> Filter:
    def check(text: str) -> FilterResult:
        chars = [c for c in text if not c.isspace()]
        ratio = sum(c.isalnum() for c in chars) / len(chars) if chars else 0.0
        if ratio < cfg.min_alnum_ratio:
            return False, f"low_alnum_ratio: {ratio:.2f} < {cfg.min_alnum_ratio}"
        words = text.split()
        symbols = text.count("#") + text.count("...") + text.count("\u2026")
        if words and symbols / len(words) > cfg.max_symbol_word_ratio:
            return False, (f"high_symbol_ratio: {symbols / len(words):.2f} symbols per word > "
                           f"{cfg.max_symbol_word_ratio}")
        return True
    return check


def _top_ngram_fraction(words: list[str], n: int) -> float:
    grams = Counter(tuple(words[i:i + n]) for i in range(len(words) - n + 1))
    if not grams:
        return 0.0
    gram, count = grams.most_common(1)[0]
    if count < 2:
        return 0.0
    return count * sum(map(len, gram)) / max(1, sum(map(len, words)))


def _duplicate_ngram_fraction(words: list[str], n: int) -> float:
    seen: set[tuple[str, ...]] = set()
    covered = [False] * len(words)
    for i in range(len(words) - n + 1):
        gram = tuple(words[i:i + n])
        if gram in seen:
            for j in range(i, i + n):
                covered[j] = True
        seen.add(gram)
    total = sum(map(len, words))
    return sum(len(w) for w, c in zip(words, covered, strict=True) if c) / total if total else 0.0


def repetition_filter(cfg: QualityConfig) -> Filter:
    def check(text: str) -> FilterResult:
        lines = [line for line in text.split("\n") if line.strip()]
        if len(lines) >= 4:
            dup = len(lines) - len(set(lines))
            if dup / len(lines) > cfg.max_duplicate_line_fraction:
                return False, (f"repeated_lines: {dup}/{len(lines)} lines repeat > "
                               f"{cfg.max_duplicate_line_fraction}")
        words = text.split()
        if len(words) < cfg.min_words_for_repetition:
            return True
        for n, limit in zip((2, 3, 4), cfg.max_top_ngram_fraction, strict=True):
            frac = _top_ngram_fraction(words, n)
            if frac > limit:
                return False, f"repeated_ngrams: top {n}-gram covers {frac:.2f} of characters > {limit}"
        frac = _duplicate_ngram_fraction(words, 5)
        if frac > cfg.max_duplicate_5gram_fraction:
            return False, (f"repeated_ngrams: repeated 5-grams cover {frac:.2f} of characters > "
                           f"{cfg.max_duplicate_5gram_fraction}")
        return True
    return check


def _non_text(c: str) -> bool:
    return c == "\ufffd" or (unicodedata.category(c) in {"Cc", "Cf", "Co", "Cn", "Cs"} and c not in "\n\t")


def non_text_filter(cfg: QualityConfig) -> Filter:
    def check(text: str) -> FilterResult:
        if not text:
            return True
        bad = sum(map(_non_text, text)) / len(text)
        if bad > cfg.max_non_text_fraction:
            return False, (f"mostly_non_text: {bad:.2f} of characters are control/unassigned/replacement > "
                           f"{cfg.max_non_text_fraction}")
        blob = sum(len(t) for t in text.split() if len(t) >= cfg.blob_token_chars) / len(text)
        if blob > cfg.max_blob_fraction:
            return False, (f"mostly_non_text: {blob:.2f} of characters are in tokens of >= "
                           f"{cfg.blob_token_chars} chars (encoded blobs) > {cfg.max_blob_fraction}")
        return True
    return check


def default_filters(cfg: QualityConfig | None = None) -> list[Filter]:
    cfg = cfg or QualityConfig()
    return [length_filter(cfg), non_text_filter(cfg), alnum_filter(cfg), repetition_filter(cfg)]


@dataclass(frozen=True)
class Dropped:
    """A record that a stage removed: which stage, the reason code, and a readable detail."""

    id: str
    stage: str
    reason: str
    detail: str
    duplicate_of: str | None = None
    similarity: float | None = None

    def to_dict(self) -> dict[str, Any]:
        return {"id": self.id, "stage": self.stage, "reason": self.reason, "detail": self.detail,
                "duplicate_of": self.duplicate_of, "similarity": self.similarity}


def quality_filter(records: Iterable[dict[str, Any]], filters: list[Filter] | QualityConfig | None = None
                   ) -> tuple[list[dict[str, Any]], list[Dropped]]:
    """Split records into (kept, dropped); each drop carries the first failing filter's reason.

    The reason code is the text before ``:`` of the filter's message (``too_short``,
    ``low_alnum_ratio``, ...), the detail the whole message.
    """
    if filters is None or isinstance(filters, QualityConfig):
        filters = default_filters(filters)
    kept: list[dict[str, Any]] = []
    dropped: list[Dropped] = []
    for record in records:
        for check in filters:
            verdict = check(record["text"])
            if verdict is True or (isinstance(verdict, tuple) and verdict[0]):
                continue
            message = verdict[1] if isinstance(verdict, tuple) else f"filtered by {getattr(check, '__qualname__', check)}"
            dropped.append(Dropped(record["id"], "quality", message.split(":", 1)[0], message))
            break
        else:
            kept.append(record)
    return kept, dropped
