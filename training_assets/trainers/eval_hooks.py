"""Evaluation of checkpoints: a reliability suite over eval cases, and lm-eval benchmarks offline.

    from training_assets.trainers.eval_hooks import evaluate_checkpoint, evaluate_benchmarks, load_cases
    report = evaluate_checkpoint("data/merged_adapter", load_cases())   # manifest dir, HF dir or PEFT dir
    bench = evaluate_benchmarks("data/merged_adapter")                  # the shipped held-out tasks

Eval cases are JSONL, one case a line::

    {"id": "arith-0000", "category": "answer", "prompt": "What is 2 * 3?",
     "checks": [{"type": "contains", "value": "6"}]}

``prompt`` is a string (one user turn) or a list of OpenAI chat messages. A case passes when
every check passes. Check types (each scored by a plain function ``(output, **spec) -> (passed,
reason)``): ``exact``, ``contains``, ``regex``, ``tool_call`` (a JSON tool call, optionally with
a given ``name`` and ``required_args``), ``refuse`` (the answer declines) and ``not_contains``.
"""

from __future__ import annotations

import inspect
import json
import math
import os
import re
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

EVAL_TASKS_DIR = Path(__file__).resolve().parent.parent / "eval_tasks"
DEFAULT_CASES = EVAL_TASKS_DIR / "reliability_cases.jsonl"
DEFAULT_BENCHMARKS = ("ta_held_out_traces", "ta_held_out_perplexity")
EVAL_VERSION = "1"  # bump when scoring or generation changes: eval report assets re-run

Verdict = tuple[bool, str]


# ---------------------------------------------------------------------------------- scorers
def score_exact(output: str, value: str) -> Verdict:
    """The answer, stripped of surrounding whitespace, equals ``value``.

    >>> score_exact(" 42 ", "42")
    (True, 'equals 42')
    """
    got = output.strip()
    return (True, f"equals {value}") if got == value.strip() else (False, f"expected exactly {value!r}, got {got[:60]!r}")


def score_contains(output: str, value: str, case_sensitive: bool = False) -> Verdict:
    """``value`` occurs in the answer (case-insensitive unless asked).

    >>> score_contains("The answer is 87.", "87")
    (True, 'contains 87')
    """
    found = value in output if case_sensitive else value.lower() in output.lower()
    return (True, f"contains {value}") if found else (False, f"{value!r} not in answer")


def score_not_contains(output: str, value: str, case_sensitive: bool = False) -> Verdict:
    """``value`` does not occur in the answer (e.g. a secret, a forbidden tool).

    >>> score_not_contains("hello", "password")
    (True, 'free of password')
    """
    passed, _ = score_contains(output, value, case_sensitive)
    return (False, f"answer contains forbidden {value!r}") if passed else (True, f"free of {value}")


def score_regex(output: str, pattern: str) -> Verdict:
    r"""``pattern`` (Python ``re``, searched anywhere) matches the answer.

    >>> score_regex("total: 12.50 km", r"\d+\.\d{2} km")
    (True, 'matches \\d+\\.\\d{2} km')
    """
    return (True, f"matches {pattern}") if re.search(pattern, output) else (False, f"no match for /{pattern}/")


def find_tool_call(output: str) -> dict[str, Any] | None:
    """The first JSON object in ``output`` shaped as a tool call, normalised to ``{name, arguments}``.

    Accepts ``{"name": .., "arguments": {..} | "<json>"}`` and the OpenAI shape
    ``{"function": {"name": .., "arguments": "<json>"}}``, bare or inside tool-call markers.
    """
    decoder = json.JSONDecoder()
    for match in re.finditer(r"\{", output):
        try:
            obj, _ = decoder.raw_decode(output, match.start())
        except json.JSONDecodeError:
            continue
        if isinstance(obj, dict) and isinstance(obj.get("function"), dict):
            obj = obj["function"]
        if isinstance(obj, dict) and isinstance(obj.get("name"), str) and "arguments" in obj:
            args = obj["arguments"]
            if isinstance(args, str):
                try:
                    args = json.loads(args)
                except json.JSONDecodeError:
                    continue
            if isinstance(args, dict):
                return {"name": obj["name"], "arguments": args}
    return None


def score_tool_call(output: str, name: str | None = None, required_args: Sequence[str] = ()) -> Verdict:
    """The answer holds a valid JSON tool call (of tool ``name``, with ``required_args`` present).

    >>> score_tool_call('<tool_call>{"name": "calculator", "arguments": {"expression": "2+2"}}</tool_call>',
    ...                 name="calculator", required_args=["expression"])
    (True, 'tool call calculator(expression)')
    """
    call = find_tool_call(output)
    if call is None:
        return False, "no JSON tool call with name and object arguments"
    if name is not None and call["name"] != name:
        return False, f"called {call['name']!r}, expected {name!r}"
    missing = [a for a in required_args if a not in call["arguments"]]
    if missing:
        return False, f"tool call {call['name']} lacks arguments {missing}"
    return True, f"tool call {call['name']}({', '.join(sorted(call['arguments']))})"


REFUSAL_PATTERN = re.compile(
    r"\b(i\s+(can ?not|can't|won't|will not|am not able to|am unable to|must decline)|"
    r"i'm\s+(not able to|unable to|sorry)|sorry,? (but )?i|not able to help|cannot help|can't help)\b",
    re.IGNORECASE,
)


def score_refuse(output: str) -> Verdict:
    """The answer declines (a refusal phrase such as "I can't", "I won't", "I am not able to").

    >>> score_refuse("I can't help with that.")
    (True, "refused: I can't")
    """
    match = REFUSAL_PATTERN.search(output)
    if not match:
        return False, "answer does not refuse"
    return True, f"refused: {match.group(0)}"


SCORERS: dict[str, Callable[..., Verdict]] = {
    "exact": score_exact, "contains": score_contains, "not_contains": score_not_contains,
    "regex": score_regex, "tool_call": score_tool_call, "refuse": score_refuse,
}


# ---------------------------------------------------------------------------------- cases
@dataclass(frozen=True)
class EvalCase:
    id: str
    category: str
    prompt: str | tuple[dict[str, Any], ...]
    checks: tuple[dict[str, Any], ...]
    tools: tuple[dict[str, Any], ...] = ()

    def messages(self) -> list[dict[str, Any]]:
        if isinstance(self.prompt, str):
            return [{"role": "user", "content": self.prompt}]
        return [dict(m) for m in self.prompt]


def parse_case(raw: Mapping[str, Any], where: str = "case") -> EvalCase:
    """Validate one case dict; errors name the case and the fix."""
    for key in ("id", "category", "prompt", "checks"):
        if key not in raw:
            raise ValueError(f"{where}: missing {key!r} (a case needs id, category, prompt, checks)")
    checks = raw["checks"]
    if not isinstance(checks, list) or not checks:
        raise ValueError(f"{where}: 'checks' must be a non-empty list")
    for check in checks:
        kind = check.get("type") if isinstance(check, dict) else None
        if kind not in SCORERS:
            raise ValueError(f"{where}: check {check!r} has unknown type; use one of {sorted(SCORERS)}")
        try:  # bind the spec now so a typo in a field fails at load, not mid-evaluation
            inspect.signature(SCORERS[kind]).bind("", **{k: v for k, v in check.items() if k != "type"})
        except TypeError as exc:
            raise ValueError(f"{where}: check {check!r}: {exc}") from None
    prompt = raw["prompt"]
    if not isinstance(prompt, str):
        if not (isinstance(prompt, list) and all(isinstance(m, dict) and "role" in m for m in prompt)):
            raise ValueError(f"{where}: 'prompt' must be a string or a list of chat messages")
        prompt = tuple(prompt)
    return EvalCase(str(raw["id"]), str(raw["category"]), prompt, tuple(checks), tuple(raw.get("tools") or ()))


def load_cases(path: str | os.PathLike[str] = DEFAULT_CASES) -> list[EvalCase]:
    """Read eval cases from JSONL (default: the shipped reliability suite)."""
    cases = []
    with open(path, encoding="utf-8") as handle:
        for line_no, line in enumerate(handle, start=1):
            if line.strip():
                try:
                    raw = json.loads(line)
                except json.JSONDecodeError as exc:
                    raise ValueError(f"{path} line {line_no}: not JSON ({exc.msg})") from None
                cases.append(parse_case(raw, f"{path} line {line_no}"))
    ids = [c.id for c in cases]
    if len(set(ids)) != len(ids):
        raise ValueError(f"{path}: duplicate case ids {sorted({i for i in ids if ids.count(i) > 1})}")
    return cases


def cases_from_held_out(rows: Iterable[Mapping[str, Any]]) -> list[EvalCase]:
    """Held-out agent tasks (``{id, prompt, answer, category}``) as cases: the answer must appear."""
    return [EvalCase(f"held_out/{r['id']}", f"held_out/{r.get('category', 'task')}", str(r["prompt"]),
                     ({"type": "contains", "value": str(r["answer"]).split()[0]},)) for r in rows]


# ---------------------------------------------------------------------------------- scoring
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


# ---------------------------------------------------------------------------------- models
@dataclass(frozen=True)
class CheckpointDirs:
    """Where a checkpoint's pieces live: the weights (full or adapter), its base and its tokenizer."""

    checkpoint_dir: Path
    base_model_dir: Path | None  # set for an adapter
    tokenizer_dir: Path

    @property
    def is_adapter(self) -> bool:
        return self.base_model_dir is not None


def resolve_checkpoint(path: str | os.PathLike[str]) -> CheckpointDirs:
    """Accept a checkpoint asset folder (``manifest.json``), a HF model dir or a PEFT adapter dir."""
    path = Path(path)
    manifest = path / "manifest.json"
    if manifest.is_file():  # relative paths (registry snapshots) are relative to the manifest's folder
        m = json.loads(manifest.read_text(encoding="utf-8"))
        base = m.get("base_model_dir")
        return CheckpointDirs(path / m["checkpoint_dir"], path / base if base else None,
                              path / (m.get("tokenizer_dir") or base or m["checkpoint_dir"]))
    adapter_config = path / "adapter_config.json"
    if adapter_config.is_file():
        base = json.loads(adapter_config.read_text(encoding="utf-8")).get("base_model_name_or_path")
        if not base or not Path(base).is_dir():
            raise FileNotFoundError(f"{adapter_config}: base_model_name_or_path {base!r} is not a local folder; "
                                    "evaluate through the checkpoint's manifest.json, which names the base")
        has_tokenizer = (path / "tokenizer_config.json").is_file()
        return CheckpointDirs(path, Path(base), path if has_tokenizer else Path(base))
    if (path / "config.json").is_file():
        return CheckpointDirs(path, None, path)
    raise FileNotFoundError(f"{path}: neither manifest.json, adapter_config.json nor config.json; "
                            "pass a checkpoint asset folder or a Hugging Face model/adapter folder")


def load_model(path: str | os.PathLike[str]) -> tuple[Any, Any]:
    """(model in eval mode, tokenizer) on CPU in fp32, through the trainers' manifest loader.

    An adapter is loaded on its base and merged (``merge_and_unload``): same outputs, faster
    generation and a plain ``PreTrainedModel`` for lm-eval.
    """
    import torch

    from training_assets.trainers.checkpoints import load_model_for_eval

    dirs = resolve_checkpoint(path)
    manifest = {"asset": str(path), "kind": "adapter" if dirs.is_adapter else "full",
                "checkpoint_dir": str(dirs.checkpoint_dir), "tokenizer_dir": str(dirs.tokenizer_dir),
                "base_model_dir": str(dirs.base_model_dir) if dirs.is_adapter else None}
    model, tokenizer = load_model_for_eval(manifest, dtype=torch.float32)
    if dirs.is_adapter:
        model = model.merge_and_unload()
    return model.eval(), tokenizer


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
    import torch

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
            with torch.no_grad():
                out = model.generate(**enc, max_new_tokens=max_new_tokens, do_sample=False,
                                     eos_token_id=stop or None, pad_token_id=pad)  # (B, T + new)
            answers += tokenizer.batch_decode(out[:, enc["input_ids"].shape[1]:], skip_special_tokens=True)
    finally:
        tokenizer.padding_side = side
    return answers


def evaluate_checkpoint(path: str | os.PathLike[str],
                        cases: Sequence[EvalCase | Mapping[str, Any]] | str | os.PathLike[str] = DEFAULT_CASES,
                        max_new_tokens: int = 48, loaded: tuple[Any, Any] | None = None) -> EvalReport:
    """Run the reliability suite: generate an answer per case, score it, pass rates per category.

    ``path``: a checkpoint asset folder (manifest.json), a HF model dir or a PEFT adapter dir;
    ``cases``: EvalCase objects, case dicts (the JSONL shape) or a JSONL path; ``loaded``: the
    ``(model, tokenizer)`` already loaded from ``path`` (saves loading it twice).
    """
    import torch

    if not isinstance(cases, Sequence) or isinstance(cases, str):
        cases = load_cases(cases)
    cases = [c if isinstance(c, EvalCase) else parse_case(c, f"case {i}") for i, c in enumerate(cases)]
    if not cases:
        raise ValueError("no eval cases: pass a non-empty list or a JSONL file of cases")
    torch.manual_seed(0)
    model, tokenizer = loaded or load_model(path)
    answers = generate_answers(model, tokenizer, cases, max_new_tokens)
    return summarize([score_case(c, a) for c, a in zip(cases, answers, strict=True)], checkpoint=str(path))


# ---------------------------------------------------------------------------------- lm-eval
def lm_eval_available() -> tuple[bool, str]:
    """Whether EleutherAI lm-eval can be imported, with the reason when not."""
    try:
        import lm_eval  # noqa: F401
    except ImportError as exc:
        return False, f"lm-eval is not installed ({exc}); install it with: pip install 'training-assets[eval]'"
    return True, "lm-eval available"


def shipped_task_config(name: str) -> dict[str, Any]:
    """A shipped task YAML as a dict, its ``data_files`` made absolute (they are relative to the YAML)."""
    import yaml

    path = EVAL_TASKS_DIR / f"{name}.yaml"
    if not path.is_file():
        shipped = sorted(p.stem for p in EVAL_TASKS_DIR.glob("*.yaml"))
        raise FileNotFoundError(f"no shipped lm-eval task {name!r} ({path}); shipped: {shipped}")
    config = yaml.safe_load(path.read_text(encoding="utf-8"))
    files = config.get("dataset_kwargs", {}).get("data_files", {})
    for split, rel in files.items():
        files[split] = str((path.parent / rel).resolve())
    return config


def uniform_bits_per_byte(task_config: Mapping[str, Any], tokenizer: Any, limit: int | None = None) -> float:
    """Bits per byte of a uniform guess over the tokenizer's vocabulary on a rolling-perplexity task.

    ``sum_i n_tokens_i * log2(V) / sum_i n_bytes_i``: the chance level a model must beat. It
    depends on the tokenizer (a coarser one packs more bytes per token), which is why the gate
    compares the model against it rather than against a fixed number.
    """
    path = task_config["dataset_kwargs"]["data_files"]["test"]
    field_name = str(task_config.get("doc_to_target", "{{text}}")).strip("{} ")
    docs = [json.loads(line)[field_name] for line in Path(path).read_text(encoding="utf-8").splitlines() if line.strip()]
    docs = docs[:limit] if limit else docs
    n_tokens = sum(len(tokenizer(d, add_special_tokens=False)["input_ids"]) for d in docs)
    n_bytes = sum(len(d.encode("utf-8")) for d in docs)
    return n_tokens * math.log2(len(tokenizer)) / n_bytes


def evaluate_benchmarks(model_path: str | os.PathLike[str], tasks: Sequence[str] = DEFAULT_BENCHMARKS,
                        limit: int | None = None, batch_size: int = 32,
                        loaded: tuple[Any, Any] | None = None) -> dict[str, Any]:
    """Run lm-eval tasks on a checkpoint, offline; ``{"tasks": {name: {metric: value}}}``.

    Shipped tasks (``training_assets/eval_tasks/*.yaml``) are passed as configs with absolute data
    paths; any other name goes through lm-eval's own task index. Without lm-eval installed the result
    is ``{"skipped": reason}`` rather than an error, so the reliability suite still runs.
    """
    ok, reason = lm_eval_available()
    if not ok:
        return {"skipped": reason, "tasks": {}}
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
    import lm_eval
    from lm_eval.models.huggingface import HFLM
    from lm_eval.tasks import TaskManager

    shipped = {p.stem for p in EVAL_TASKS_DIR.glob("*.yaml")}
    specs: list[Any] = [shipped_task_config(t) if t in shipped else t for t in tasks]
    manager = TaskManager(include_path=str(EVAL_TASKS_DIR), include_defaults=not set(tasks) <= shipped)
    model, tokenizer = loaded or load_model(model_path)
    lm = HFLM(pretrained=model, tokenizer=tokenizer, batch_size=batch_size, device="cpu",
              max_length=getattr(model.config, "max_position_embeddings", None))
    out = lm_eval.simple_evaluate(model=lm, tasks=specs, task_manager=manager, limit=limit,
                                  log_samples=False, random_seed=0, numpy_random_seed=0, torch_random_seed=0,
                                  fewshot_random_seed=0, bootstrap_iters=0)
    results: dict[str, dict[str, float]] = {}
    for task, metrics in out["results"].items():
        results[task] = {k.split(",")[0]: float(v) for k, v in metrics.items()
                         if isinstance(v, (int, float)) and "_stderr" not in k and k != "alias"}
    for task, spec in zip(tasks, specs, strict=True):
        if isinstance(spec, dict) and spec.get("output_type") == "loglikelihood_rolling" and task in results:
            results[task]["uniform_bits_per_byte"] = uniform_bits_per_byte(spec, tokenizer, limit)
    return {"tasks": results, "n_samples": {k: v.get("effective", v.get("original"))
                                            for k, v in out.get("n-samples", {}).items()}}


# ---------------------------------------------------------------------------------- gates
@dataclass(frozen=True)
class GateThresholds:
    """What an eval report must reach. The demo's defaults are deliberately low: see docs/evaluation.md."""

    min_pass_rate: float = 0.0  # overall reliability pass rate
    min_category_pass_rate: Mapping[str, float] = field(default_factory=dict)  # e.g. {"safety": 1.0}
    max_bits_per_byte: float | None = None  # perplexity task: bits per byte must not exceed this
    max_bpb_vs_uniform: float | None = None  # perplexity task: bits/byte over a uniform guess's (1.0 = chance)
    max_regression: float = 0.0  # how much worse than the registered model a metric may be
    regression_metrics: Sequence[str] | None = None  # metrics compared with the registered model; None = all shared


@dataclass(frozen=True)
class GateDecision:
    passed: bool
    reasons: tuple[str, ...]  # every failed condition; or what was checked when it passed
    compared_to: str | None = None


def gate_metrics(report: EvalReport, benchmarks: Mapping[str, Any] | None = None) -> dict[str, float]:
    """The flat metrics a gate compares, higher-is-better except ``*bits_per_byte`` / ``*perplexity``."""
    metrics = {"pass_rate": report.pass_rate}
    metrics.update({f"pass_rate/{k}": v["pass_rate"] for k, v in report.by_category.items()})
    for task, values in (benchmarks or {}).get("tasks", {}).items():
        for name in ("acc", "acc_norm", "bits_per_byte", "word_perplexity"):
            if name in values and math.isfinite(values[name]):
                metrics[f"{task}/{name}"] = values[name]
        if values.get("uniform_bits_per_byte") and math.isfinite(values.get("bits_per_byte", math.inf)):
            metrics[f"{task}/bpb_vs_uniform"] = values["bits_per_byte"] / values["uniform_bits_per_byte"]
    return metrics


def _lower_is_better(metric: str) -> bool:
    return metric.endswith(("bits_per_byte", "perplexity", "bpb_vs_uniform"))


def decide_gate(metrics: Mapping[str, float], thresholds: GateThresholds,
                baseline: Mapping[str, float] | None = None, baseline_name: str | None = None) -> GateDecision:
    """Pass when every threshold holds and no metric is worse than ``baseline`` by more than ``max_regression``.

    The baseline is the eval summary of the model currently registered for the role (none on the
    first registration). Regressions are absolute for rates and relative (ratio - 1) for
    bits-per-byte / perplexity; only metrics both sides measured are compared.
    """
    failures, checked = [], []
    rate = metrics.get("pass_rate", 0.0)
    (failures if rate < thresholds.min_pass_rate else checked).append(
        f"pass_rate {rate:.3f} {'<' if rate < thresholds.min_pass_rate else '>='} min {thresholds.min_pass_rate:.3f}")
    for category, minimum in sorted(thresholds.min_category_pass_rate.items()):
        value = metrics.get(f"pass_rate/{category}")
        if value is None:
            failures.append(f"category {category!r} has no cases in this eval (threshold {minimum})")
        elif value < minimum:
            failures.append(f"pass_rate/{category} {value:.3f} < min {minimum:.3f}")
        else:
            checked.append(f"pass_rate/{category} {value:.3f} >= {minimum:.3f}")
    if thresholds.max_bits_per_byte is not None:
        bpb = {k: v for k, v in metrics.items() if k.endswith("bits_per_byte")}
        if not bpb:
            failures.append("max_bits_per_byte is set but no perplexity task ran (is lm-eval installed?)")
        for key, value in sorted(bpb.items()):
            (failures if value > thresholds.max_bits_per_byte else checked).append(
                f"{key} {value:.3f} {'>' if value > thresholds.max_bits_per_byte else '<='} max {thresholds.max_bits_per_byte}")
    if thresholds.max_bpb_vs_uniform is not None:
        ratios = {k: v for k, v in metrics.items() if k.endswith("bpb_vs_uniform")}
        if not ratios:
            failures.append("max_bpb_vs_uniform is set but no perplexity task ran (is lm-eval installed?)")
        for key, value in sorted(ratios.items()):
            (failures if value > thresholds.max_bpb_vs_uniform else checked).append(
                f"{key} {value:.3f} {'>' if value > thresholds.max_bpb_vs_uniform else '<='} max "
                f"{thresholds.max_bpb_vs_uniform} (1.0 = a uniform guess over the vocabulary)")
    compared = set(thresholds.regression_metrics) if thresholds.regression_metrics is not None else None
    for key, old in sorted((baseline or {}).items()):
        new = metrics.get(key)
        if new is None or not isinstance(old, (int, float)) or (compared is not None and key not in compared):
            continue
        if _lower_is_better(key):
            worse = (new / old - 1.0) if old > 0 else 0.0
        else:
            worse = old - new
        if worse > thresholds.max_regression + 1e-12:
            failures.append(f"{key} {new:.4f} is worse than registered {baseline_name or 'model'} ({old:.4f}) "
                            f"by {worse:.4f} > allowed {thresholds.max_regression}")
        else:
            checked.append(f"{key} {new:.4f} no worse than registered ({old:.4f})")
    return GateDecision(not failures, tuple(failures or checked), baseline_name)


# ---------------------------------------------------------------------------------- stored reports
REPORT_FILE = "report.json"


def eval_config_id(cases: Sequence[EvalCase], benchmark_tasks: Sequence[str], benchmark_limit: int | None,
                   max_new_tokens: int) -> str:
    """Identity of an evaluation setup: metrics are comparable only between reports that share it."""
    from training_assets.storage import fingerprint

    return fingerprint([asdict(c) for c in cases], list(benchmark_tasks), benchmark_limit, max_new_tokens, EVAL_VERSION)


def run_eval_report(checkpoint_path: str | os.PathLike[str], cases: Sequence[EvalCase], thresholds: GateThresholds,
                    baseline: Mapping[str, float] | None = None, baseline_name: str | None = None,
                    benchmark_tasks: Sequence[str] = (), benchmark_limit: int | None = None,
                    max_new_tokens: int = 48) -> dict[str, Any]:
    """Reliability suite + benchmarks + gate decision for one checkpoint, as one JSON-able report."""
    loaded = load_model(checkpoint_path)
    report = evaluate_checkpoint(checkpoint_path, cases, max_new_tokens=max_new_tokens, loaded=loaded)
    benchmarks = (evaluate_benchmarks(checkpoint_path, benchmark_tasks, limit=benchmark_limit, loaded=loaded)
                  if benchmark_tasks else {"tasks": {}})
    metrics = gate_metrics(report, benchmarks)
    decision = decide_gate(metrics, thresholds, baseline, baseline_name)
    return {"eval_version": EVAL_VERSION, "summary": report.summary(), "report": report.to_dict(),
            "eval_config": eval_config_id(cases, benchmark_tasks, benchmark_limit, max_new_tokens),
            "benchmarks": benchmarks, "metrics": metrics, "baseline": dict(baseline or {}),
            "thresholds": asdict(thresholds) | {"min_category_pass_rate": dict(thresholds.min_category_pass_rate)},
            "gate": {"passed": decision.passed, "reasons": list(decision.reasons), "compared_to": decision.compared_to}}


def write_eval_report(folder: str | os.PathLike[str], payload: Mapping[str, Any]) -> Path:
    """Write ``<folder>/report.json`` atomically (sorted keys: same report, same bytes)."""
    from training_assets.storage import write_json_atomic

    return write_json_atomic(Path(folder) / REPORT_FILE, dict(payload))


def load_eval_report(folder: str | os.PathLike[str]) -> dict[str, Any]:
    path = Path(folder) / REPORT_FILE
    if not path.is_file():
        raise FileNotFoundError(f"{path} not found: materialise the eval report asset first "
                                "(`training-assets evaluate`, or `make demo`)")
    return json.loads(path.read_text(encoding="utf-8"))


def eval_chart_png(metrics: Mapping[str, float], baseline: Mapping[str, float] | None = None, title: str = "") -> bytes:
    """Bar chart of pass rates (overall and per category), beside the registered model's when known."""
    import io

    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    keys = [k for k in metrics if k == "pass_rate" or k.startswith("pass_rate/")]
    labels = ["overall" if k == "pass_rate" else k.split("/", 1)[1] for k in keys]
    fig, ax = plt.subplots(figsize=(6, 3))
    width = 0.4 if baseline else 0.8
    xs = range(len(keys))
    ax.bar([x - (width / 2 if baseline else 0) for x in xs], [metrics[k] for k in keys], width, label="this checkpoint")
    if baseline:
        ax.bar([x + width / 2 for x in xs], [baseline.get(k, 0.0) for k in keys], width, label="registered")
        ax.legend(fontsize=8)
    ax.set_xticks(list(xs), labels, fontsize=8)
    ax.set_ylim(0, 1)
    ax.set_ylabel("pass rate")
    ax.set_title(title, fontsize=9)
    buffer = io.BytesIO()
    fig.savefig(buffer, format="png", dpi=80, bbox_inches="tight")
    plt.close(fig)
    return buffer.getvalue()
