"""Decontamination: drop training records that share a word n-gram with a held-out eval example.

Held-out examples are indexed as hashed word n-grams (same hashing as dedup shingles: ASCII
case-folded words split on whitespace, 64-bit hashes). The default ``ngram=13`` follows GPT-3
(Brown et al. 2020, appendix C). An example shorter than ``ngram`` words is indexed whole (its
own length as n), so a short prompt copied verbatim is still caught; one shorter than
``min_ngram`` words is too generic to index and is reported in ``stats['too_short']``.

Guidance: prose evals: 13 (8 for short QA prompts). Code evals: 8-10 — code has many shared
boilerplate 13-grams (imports, signatures) that would over-drop; raise ``min_ngram`` instead of
lowering ``ngram`` when short generic examples cause false drops.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from training_assets_kernels import dedup as K
from training_assets.data_engine.dedup import pack_texts
from training_assets.data_engine.filters import Dropped, normalize

DEFAULT_NGRAM = 13
DEFAULT_MIN_NGRAM = 5
DEFAULT_FIELDS = ("prompt",)


@dataclass(frozen=True)
class HeldOutExample:
    eval_set: str
    example_id: str
    text: str


def load_held_out(paths: Iterable[str | os.PathLike[str]], fields: Sequence[str] = DEFAULT_FIELDS) -> list[HeldOutExample]:
    """Read held-out JSONL files; the eval set name is the file stem, the text the given fields joined.

    Each row needs an ``id``; a missing file, bad JSON or a row without the fields raises
    ``ValueError`` naming the file and line.
    """
    examples = []
    for path in sorted(Path(p) for p in paths):
        if not path.is_file():
            raise ValueError(f"held-out set {path}: no such file; fix the configured path")
        with open(path, encoding="utf-8") as handle:
            for line_no, line in enumerate(handle, start=1):
                if not line.strip():
                    continue
                try:
                    row = json.loads(line)
                except ValueError as exc:
                    raise ValueError(f"held-out set {path} line {line_no}: not JSON ({exc})") from None
                missing = [f for f in ("id", *fields) if f not in row]
                if missing:
                    raise ValueError(f"held-out set {path} line {line_no}: missing field(s) {missing}")
                text = "\n".join(str(row[f]) for f in fields)
                examples.append(HeldOutExample(path.stem, str(row["id"]), text))
    return examples


def _as_examples(held_out: Iterable[HeldOutExample | dict[str, Any]]) -> list[HeldOutExample]:
    out = []
    for item in held_out:
        if isinstance(item, HeldOutExample):
            out.append(item)
        else:
            text = item.get("text", item.get("prompt"))
            if text is None or "id" not in item:
                raise ValueError(f"held-out example {item!r} needs 'id' and 'text' (or 'prompt')")
            out.append(HeldOutExample(str(item.get("eval_set", "held_out")), str(item["id"]), str(text)))
    return out


@dataclass
class NgramIndex:
    """Sorted n-gram hashes per n, and for each hash the (eval set, example id) it came from."""

    by_n: dict[int, tuple[np.ndarray, list[tuple[str, str]]]] = field(default_factory=dict)
    too_short: list[tuple[str, str]] = field(default_factory=list)

    @property
    def size(self) -> int:
        return sum(len(h) for h, _ in self.by_n.values())


def build_index(held_out: Iterable[HeldOutExample | dict[str, Any]], ngram: int = DEFAULT_NGRAM,
                min_ngram: int = DEFAULT_MIN_NGRAM) -> NgramIndex:
    if ngram < 1 or min_ngram < 1:
        raise ValueError(f"decontamination n-grams must be >= 1 word: ngram={ngram}, min_ngram={min_ngram}")
    examples = _as_examples(held_out)
    texts = [normalize(e.text) for e in examples]
    lengths = [len(t.split()) for t in texts]
    index = NgramIndex()
    groups: dict[int, list[int]] = {}
    for i, n_words in enumerate(lengths):
        if n_words < min_ngram:
            index.too_short.append((examples[i].eval_set, examples[i].example_id))
        else:
            groups.setdefault(min(ngram, n_words), []).append(i)
    for n, members in sorted(groups.items()):
        data, offsets = pack_texts([texts[i] for i in members])
        hash_offsets, hashes = K.shingle_hashes(data, offsets, n)
        owner = np.repeat(np.arange(len(members)), np.diff(hash_offsets))
        order = np.argsort(hashes, kind="stable")  # first example wins on a shared n-gram
        keys, first = np.unique(hashes[order], return_index=True)
        sources = [(examples[members[j]].eval_set, examples[members[j]].example_id) for j in owner[order][first]]
        index.by_n[n] = (keys, sources)
    return index


@dataclass
class DecontamResult:
    kept: list[dict[str, Any]]
    dropped: list[Dropped]
    stats: dict[str, Any]


def find_overlaps(texts: Sequence[str], index: NgramIndex) -> list[tuple[str, str, int] | None]:
    """For each text, (eval set, example id, n) of a held-out n-gram it contains, else None."""
    hits: list[tuple[str, str, int] | None] = [None] * len(texts)
    if not texts or not index.by_n:
        return hits
    data, offsets = pack_texts([normalize(t) for t in texts])
    for n, (keys, sources) in sorted(index.by_n.items(), reverse=True):
        hash_offsets, hashes = K.shingle_hashes(data, offsets, n)
        found = K.contains_any(hash_offsets, hashes, keys)
        for d in np.nonzero(found >= 0)[0].tolist():
            if hits[d] is None:
                hits[d] = (*sources[found[d]], n)
    return hits


def decontaminate(records: Sequence[dict[str, Any]], held_out: Iterable[HeldOutExample | dict[str, Any]] | NgramIndex,
                  ngram: int = DEFAULT_NGRAM, min_ngram: int = DEFAULT_MIN_NGRAM) -> DecontamResult:
    """Drop every record sharing a word n-gram with a held-out example; the reason names the eval
    set and the example id (``held_out_overlap``)."""
    index = held_out if isinstance(held_out, NgramIndex) else build_index(held_out, ngram, min_ngram)
    hits = find_overlaps([r["text"] for r in records], index)
    kept, dropped = [], []
    for record, hit in zip(records, hits, strict=True):
        if hit is None:
            kept.append(record)
        else:
            eval_set, example_id, n = hit
            dropped.append(Dropped(record["id"], "decontaminate", "held_out_overlap",
                                   f"shares a {n}-gram with {eval_set}/{example_id}"))
    stats = {"input": len(records), "kept": len(kept), "dropped": len(dropped), "index_ngrams": index.size,
             "ngram": ngram, "min_ngram": min_ngram, "too_short": [f"{s}/{i}" for s, i in index.too_short]}
    return DecontamResult(kept, dropped, stats)
