"""Data tools (the data curator's): corpus curation, dedup, decontamination, lineage, tokenizer,
datasets and the GRPO reward. Each mutating one plans by default and materialises its asset."""

from __future__ import annotations

from typing import Annotated, Any, Literal

from mcp.server.mcpserver import Context
from pydantic import BaseModel, ConfigDict, Field

from training_assets.agent import graph_map
from training_assets.agent.errors import ToolInputError
from training_assets.agent.models import ActionResult, AssetStep, LineageResult
from training_assets.agent.planning import ancestors
from training_assets.agent.runtime import Runtime
from training_assets.agent.tools.actions import producer_hint, run_action
from training_assets.agent.tools.base import OptionsArg, blocking, config_arg, runtime, tool
from training_assets.agent.tools.observe import asset_state
from training_assets.agent.tools.schemas import overrides

CurateConfig = config_arg("curate_corpus")
DedupConfig = config_arg("dedup_corpus")
DecontamConfig = config_arg("decontaminate_corpus")
TokenizerConfigArg = config_arg("train_tokenizer")
DatasetConfig = config_arg("build_training_dataset")
RewardConfig = config_arg("compose_reward")


def _corpus_facts(rt: Runtime, result: ActionResult) -> dict[str, Any]:
    meta = rt.backend.asset_states(["curated_corpus"])["curated_corpus"].get("metadata") or {}
    keys = ("records", "dataset_version", "dedup", "signatures")
    return {"current_corpus": {k: meta[k] for k in keys if k in meta}} if meta else {"current_corpus": None}


@tool("plan", "Curate the corpus")
async def curate_corpus(ctx: Context, config: CurateConfig = None, options: OptionsArg = None) -> ActionResult:
    """Materialise curated_corpus: every trace batch rendered to text, normalised, quality-filtered,
    deduplicated (exact + MinHash/LSH) and decontaminated against the held-out sets, each record kept
    or dropped with a reason. New inbox batches are ingested first (one run each, local instance).
    Config: curated_corpus and held_out_sets fields; files (paths, extra_sources) must lie under the
    data root or $TRAINING_ASSETS_SOURCE_DIRS, ray_address on an allowed host. Plans by default."""
    return await run_action(ctx, "curate_corpus", config, options, details=_corpus_facts)


@tool("plan", "Deduplicate the corpus")
async def dedup_corpus(ctx: Context, config: DedupConfig = None, options: OptionsArg = None) -> ActionResult:
    """Re-run the corpus dedup with new settings (method minhash|cosine, threshold, and the blocking
    dedup-rate bounds): materialises curated_corpus. The MinHash shingling (ngram, num_perm, seed) is
    the deployment's `minhash` resource, shared with the per-batch signatures, not a tool setting. The plan shows the current
    dedup statistics. Plans by default."""
    return await run_action(ctx, "dedup_corpus", config, options, details=_corpus_facts)


@tool("plan", "Decontaminate the corpus")
async def decontaminate_corpus(ctx: Context, config: DecontamConfig = None, options: OptionsArg = None) -> ActionResult:
    """Re-run decontamination against the held-out eval sets: held_out_sets paths/fields and the
    n-gram index settings (decontam_ngram, decontam_min_ngram); materialises held_out_sets (when its
    config is given) and curated_corpus. Held-out paths must lie under the data root or a folder of
    $TRAINING_ASSETS_SOURCE_DIRS. Plans by default."""
    return await run_action(ctx, "decontaminate_corpus", config, options, details=_corpus_facts)


def _lineage(rt: Runtime, record_id: str | None, asset: str | None) -> LineageResult:
    from training_assets import data_engine  # numba and pyarrow: ~1 s, the server builds without them

    out = LineageResult()
    if record_id:
        try:
            out.record = data_engine.lineage(record_id, rt.root)
        except KeyError:
            raise ToolInputError("record_id", f"no record {record_id!r} in the curated corpus's decisions; "
                                 "pass a trace id (or <source>:<n> for extra sources)") from None
        except FileNotFoundError:
            raise ToolInputError("record_id", "curated_corpus was never materialised: run curate_corpus first") from None
    if asset:
        graph = rt.backend.graph()
        if asset not in graph:
            raise ToolInputError("asset", f"unknown asset {asset!r}; one of {sorted(graph)}")
        keys = ancestors(graph, [asset])
        states = rt.backend.asset_states(keys)
        if not states[asset]["materialized"] and states[asset]["stale_status"] == "MISSING" and not graph[asset]["partitioned"]:
            raise ToolInputError("asset", f"{asset} was never materialised, so it has no lineage yet; "
                                          f"{producer_hint(asset)}")
        out.asset = asset_state(graph, asset, states[asset])
        out.upstream = [AssetStep(asset=k, reason=states[k]["stale_status"], data_version=states[k]["data_version"])
                        for k in keys if k != asset]
    return out


@tool("read", "Dataset lineage")
async def dataset_lineage(ctx: Context, record_id: Annotated[str | None, Field(description=(
                              "A record id (trace id): why it was kept or dropped, and duplicate of what."))] = None,
                          asset: Annotated[str | None, Field(description=(
                              "An asset key: its state and every upstream asset with its data version."))] = None
                          ) -> LineageResult:
    """Lineage: for a record, why curation kept or dropped it (stage, reason, duplicate-of, cluster);
    for an asset, its data version and the data versions of everything upstream of it."""
    if not record_id and not asset:
        raise ToolInputError("record_id", "pass record_id (a trace id) or asset (an asset key)")
    return await blocking(_lineage, runtime(ctx), record_id, asset)


@tool("plan", "Train the tokenizer")
async def train_tokenizer(ctx: Context, config: TokenizerConfigArg = None, options: OptionsArg = None) -> ActionResult:
    """Materialise the tokenizer: byte-level BPE on the curated corpus with role and tool tokens and the
    chat template (vocab_size, min_frequency, max_chars, held_back_fraction, seed). Plans by default."""
    return await run_action(ctx, "train_tokenizer", config, options)


DatasetKind = Literal[tuple(graph_map.DATASET_KINDS)]


@tool("plan", "Build a training dataset")
async def build_training_dataset(ctx: Context, kind: Annotated[DatasetKind, Field(description=", ".join(
                                     f"{name} -> {dataset}" for name, dataset in graph_map.DATASET_KINDS.items()))],
                                 config: DatasetConfig = None, options: OptionsArg = None) -> ActionResult:
    """Materialise one training dataset from the traces (and the tokenizer): SFT examples, DPO
    preference pairs, GRPO groups with group-normalised advantages, or packed pretrain windows.
    Plans by default."""
    asset = graph_map.DATASET_KINDS[kind]
    return await run_action(ctx, "build_training_dataset", config, options, assets=(asset,))


class ScoredCompletion(BaseModel):
    model_config = ConfigDict(extra="forbid")
    completion: str | list[dict[str, Any]] = Field(description="The assistant's text, or its messages.")
    success: bool | None = None
    expected_answer: str | None = None


def _reward_preview(completions: list[ScoredCompletion] | None, weights: dict[str, float] | None) -> dict[str, Any]:
    from training_assets.training_data import rewards  # pyarrow: ~0.3 s, the server builds without it

    try:  # scoring nothing validates the weights and returns them as the reward engine uses them
        checked = rewards.score_reward([], weights, success=[], expected_answer=[]).weights
    except ValueError as exc:
        raise ToolInputError("config.reward_weights", str(exc)) from None
    out: dict[str, Any] = {"weights": checked, "components": sorted(rewards.REWARD_COMPONENTS)}
    if completions:
        kwargs = {k: [getattr(c, k) for c in completions] for k in ("success", "expected_answer")}
        scores = rewards.score_reward([c.completion for c in completions], checked, **kwargs)
        out["scores"] = [{"total": scores.total[i], **{k: v[i] for k, v in scores.components.items()}}
                         for i in range(len(completions))]
    return out


@tool("plan", "Compose the GRPO reward")
async def compose_reward(ctx: Context, config: RewardConfig = None,
                         completions: Annotated[list[ScoredCompletion] | None, Field(description=(
                             "Completions to score with the composed reward (a preview; optional)."))] = None,
                         options: OptionsArg = None) -> ActionResult:
    """Compose the composite GRPO reward from weighted components (success, answer, tool_json,
    efficiency, length): config {"reward_weights": {...}, "scale_rewards": "group"|"none"}. The plan
    scores the given completions with it; executed, grpo_groups is rebuilt with these rewards."""
    weights = (overrides(config) or {}).get("reward_weights")
    preview = await blocking(_reward_preview, completions, weights)
    return await run_action(ctx, "compose_reward", config, options, details=lambda rt, r: {"reward": preview})
