"""SFT examples: successful traces as chat conversations with assistant-only loss masks."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from training_assets.training_data.common import BuildResult, as_trace, has_completion, messages_json, trace_messages
from training_assets.traces import Trace


def build_sft_examples(traces: Iterable[Trace | Mapping[str, Any]], tokenizer: Any = None, max_tokens: int | None = None) -> BuildResult:
    """One example per successful trace: ``{id, task_id, messages}`` (+ ``input_ids``, ``assistant_mask``, ``n_tokens``).

    Multi-turn conversations keep their tool calls and tool results. With a ``tokenizer`` (one
    with the chat template of ``tokenizer_trainer``), each example is tokenised and
    ``assistant_mask[t] = 1`` exactly on assistant-turn tokens, end-of-turn included; the
    system/user/tool tokens are context only. Traces are taken in (task_id, trace_id) order, so
    the result does not depend on the order batches arrived in.

    Skipped, with the reason: failed traces, traces without an assistant turn that says or calls
    something, exact repeats of an earlier conversation, and (with ``max_tokens``) examples
    longer than ``max_tokens`` (never truncated: a cut example would lose its end-of-turn).
    """
    result = BuildResult()
    seen: set[str] = set()
    for trace in sorted(map(as_trace, traces), key=lambda t: (t.task_id, t.trace_id)):
        if not trace.outcome.success:
            result.skipped.append((trace.trace_id, "not successful"))
            continue
        messages = trace_messages(trace)
        if not has_completion(messages):
            result.skipped.append((trace.trace_id, "no assistant turn with content or tool calls"))
            continue
        text = messages_json(messages)
        if text in seen:
            result.skipped.append((trace.trace_id, "repeats an earlier conversation"))
            continue
        seen.add(text)
        row: dict[str, Any] = {"id": trace.trace_id, "task_id": trace.task_id, "messages": text}
        if tokenizer is not None:
            encoded = tokenizer.apply_chat_template(messages, tokenize=True, return_dict=True,
                                                    return_assistant_tokens_mask=True)
            ids, mask = list(encoded["input_ids"]), list(encoded["assistant_masks"])
            if max_tokens is not None and len(ids) > max_tokens:
                result.skipped.append((trace.trace_id, f"{len(ids)} tokens > max_tokens={max_tokens}"))
                continue
            row.update(input_ids=ids, assistant_mask=mask, n_tokens=len(ids))
        result.rows.append(row)
    return result
