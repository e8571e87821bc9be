"""The reliability suite: a greedy answer per eval case, every check scored, pass rates per category.

    report = evaluate_checkpoint("data/merged_adapter", load_cases())   # manifest dir, HF dir or PEFT dir
    report.pass_rate, report.by_category["safety"]["pass_rate"], report.results[0].checks
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

from training_assets.checkpoint_loading import load_checkpoint
from training_assets.evaluation.cases import DEFAULT_CASES, EvalCase, load_cases, parse_case
from training_assets.evaluation.device import Placement, resolve_device
from training_assets.evaluation.scorers import SCORERS


@dataclass(frozen=True)
class CaseResult:
    id: str
    category: str
    passed: bool
    output: str
    checks: tuple[dict[str, Any], ...]  # {type, passed, reason}


def score_case(case: EvalCase, output: str) -> CaseResult:
    """Run every check of ``case`` on ``output``; the case passes when all do."""
    verdicts = []
    for check in case.checks:
        spec = {k: v for k, v in check.items() if k != "type"}
        passed, reason = SCORERS[check["type"]](output, **spec)
        verdicts.append({"type": check["type"], "passed": passed, "reason": reason})
    return CaseResult(case.id, case.category, all(v["passed"] for v in verdicts), output, tuple(verdicts))


@dataclass
class EvalReport:
    """Pass rates overall and per category, and every case's result."""

    n_cases: int
    pass_rate: float
    by_category: dict[str, dict[str, float]]  # category -> {n, passed, pass_rate}
    results: list[CaseResult] = field(default_factory=list)
    checkpoint: str = ""

    def summary(self) -> dict[str, Any]:
        return {"n_cases": self.n_cases, "pass_rate": self.pass_rate,
                "by_category": {k: v["pass_rate"] for k, v in self.by_category.items()}}

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def summarize(results: Sequence[CaseResult], checkpoint: str = "") -> EvalReport:
    by_category: dict[str, dict[str, float]] = {}
    for result in results:
        cat = by_category.setdefault(result.category, {"n": 0, "passed": 0})
        cat["n"] += 1
        cat["passed"] += int(result.passed)
    for cat in by_category.values():
        cat["pass_rate"] = cat["passed"] / cat["n"]
    passed = sum(r.passed for r in results)
    return EvalReport(len(results), passed / len(results) if results else 0.0,
                      dict(sorted(by_category.items())), list(results), checkpoint)


def _stop_ids(model: Any, tokenizer: Any) -> list[int]:
    ids = model.generation_config.eos_token_id
    ids = list(ids) if isinstance(ids, (list, tuple)) else ([ids] if ids is not None else [])
    if tokenizer.eos_token_id is not None and tokenizer.eos_token_id not in ids:
        ids.append(tokenizer.eos_token_id)
    return ids


def _prompt_text(tokenizer: Any, case: EvalCase) -> str:
    if tokenizer.chat_template:
        return tokenizer.apply_chat_template(case.messages(), tools=list(case.tools) or None,
                                             add_generation_prompt=True, tokenize=False)
    return "\n".join(str(m.get("content") or "") for m in case.messages()) + "\n"


def generate_answers(model: Any, tokenizer: Any, cases: Sequence[EvalCase], max_new_tokens: int = 48,
                     batch_size: int = 32) -> list[str]:
    """Greedy answer per case, generated in left-padded batches (one decode step serves the batch).

    The same cases in the same order give the same batches, hence the same answers on every run.
    """
    import torch  # torch: import-time stays torch-free

    stop = _stop_ids(model, tokenizer)
    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else (stop[0] if stop else 0)
    side, tokenizer.padding_side = tokenizer.padding_side, "left"  # decoder-only: new tokens follow the prompt
    answers: list[str] = []
    try:
        for start in range(0, len(cases), batch_size):
            texts = [_prompt_text(tokenizer, c) for c in cases[start:start + batch_size]]
            enc = tokenizer(texts, add_special_tokens=False, padding=True, return_tensors="pt")  # (B, T)
            if tokenizer.pad_token_id is None:
                enc["input_ids"][enc["attention_mask"] == 0] = pad
            enc = {k: v.to(model.device) for k, v in enc.items()}
            with torch.no_grad():
                out = model.generate(**enc, max_new_tokens=max_new_tokens, do_sample=False,
                                     eos_token_id=stop or None, pad_token_id=pad)  # (B, T + new)
            answers += tokenizer.batch_decode(out[:, enc["input_ids"].shape[1]:], skip_special_tokens=True)
    finally:
        tokenizer.padding_side = side
    return answers


def load_for_eval(path: str | os.PathLike[str], device: str = "auto", dtype: str = "auto") -> tuple[Any, Any, Placement]:
    """``(model, tokenizer, placement)``: the checkpoint (adapter merged) in ``dtype`` on ``device`` (``resolve_device``)."""
    placement = resolve_device(device, dtype)
    model, tokenizer = load_checkpoint(path, merge_adapter=True, dtype=placement.dtype)
    return model.to(placement.device), tokenizer, placement


def evaluate_checkpoint(path: str | os.PathLike[str],
                        cases: Sequence[EvalCase | Mapping[str, Any]] | str | os.PathLike[str] = DEFAULT_CASES,
                        max_new_tokens: int = 48, loaded: tuple[Any, Any] | None = None, device: str = "auto",
                        dtype: str = "auto", batch_size: int = 32) -> EvalReport:
    """Run the reliability suite: generate an answer per case, score it, pass rates per category.

    ``path``: a checkpoint asset folder (manifest.json), a HF model dir or a PEFT adapter dir;
    ``cases``: EvalCase objects, case dicts (the JSONL shape) or a JSONL path; ``loaded``: the
    ``(model, tokenizer)`` already loaded from ``path`` (saves loading it twice; ``device`` and
    ``dtype`` then do not apply); ``device`` / ``dtype``: see ``evaluation.device`` (auto: CUDA +
    bf16 when there is a GPU, else CPU fp32); ``batch_size``: cases per left-padded generate call.
    """
    import torch  # torch: import-time stays torch-free

    if not isinstance(cases, Sequence) or isinstance(cases, str):
        cases = load_cases(cases)
    cases = [c if isinstance(c, EvalCase) else parse_case(c, f"case {i}") for i, c in enumerate(cases)]
    if not cases:
        raise ValueError("no eval cases: pass a non-empty list or a JSONL file of cases")
    torch.manual_seed(0)
    model, tokenizer = loaded or load_for_eval(path, device, dtype)[:2]
    answers = generate_answers(model, tokenizer, cases, max_new_tokens, batch_size)
    return summarize([score_case(c, a) for c, a in zip(cases, answers, strict=True)], checkpoint=str(path))
