"""Declarative automation: a new trace batch flows on its own from raw_traces to a registry version.

The ``trace_batch_sensor`` launches ``raw_traces[batch]``; from there every asset carries an
``AutomationCondition`` evaluated by ``training_automation_sensor`` (running by default):

- ``minhash_signatures[batch]``: when its ``raw_traces`` partition updates *and* that partition's
  blocking quarantine check passed. A batch of only bad lines stops here: its check fails, no
  signatures, nothing downstream.
- ``held_out_sets``: once, when missing. ``tokenizer``: once, when missing (a new tokenizer
  invalidates every checkpoint); ``TRAINING_ASSETS_RETRAIN_TOKENIZER=1`` makes it follow the
  corpus like any other asset, and a manual materialisation is always possible.
- ``curated_corpus`` and everything that is not training (selected traces, datasets, eval
  reports, ``registry_entry``): when a dependency updated (or is requested on the same tick, so a
  chain runs as one run), no dependency missing or in progress, every upstream blocking check
  passed. ``raw_traces`` updates are ignored downstream of it: a batch reaches the corpus through
  its signatures, so the corpus is curated once per batch, not twice.
- The training assets (``pool="training"``: one training step at a time, see dagster.yaml):
  the same, and the retraining policy (``RetrainingPolicy``) on top; ``base_checkpoint`` is
  pretrained once per tokenizer (``base_model_condition``).

Every sub-condition carries a label, so the UI's automation evaluation of an asset shows which
part held or not ("new_valid_traces >= 200", "all_deps_blocking_checks_passed", ...).
"""

from __future__ import annotations

import os
from dataclasses import dataclass

import dagster as dg

TRAINING_POOL = "training"
BATCH_ASSET = "raw_traces"
SIGNATURES_ASSET = "minhash_signatures"

_PAGE = 1000  # materialisation records fetched per event-log query


@dataclass(frozen=True)
class RetrainingPolicy:
    """When the training assets run: enough new valid traces since the asset's last training, and/or a cron tick.

    ``min_new_traces``: valid traces in batches first curated (signatures staged) after the asset's
    latest materialisation; 1 = retrain on every batch. ``cron``: if set, training also waits for
    a tick of this schedule (UTC) and then needs ``min_new_traces`` as well.
    ``retrain_tokenizer``: the tokenizer follows the corpus instead of staying fixed.
    """

    min_new_traces: int = 1
    cron: str = ""
    retrain_tokenizer: bool = False

    @classmethod
    def from_env(cls, env: dict[str, str] | None = None) -> RetrainingPolicy:
        env = dict(os.environ if env is None else env)
        raw = env.get("TRAINING_ASSETS_RETRAIN_MIN_TRACES", "1")
        try:
            min_new = int(raw)
        except ValueError:
            raise ValueError(f"TRAINING_ASSETS_RETRAIN_MIN_TRACES={raw!r} is not an integer; set a count of "
                             "valid traces such as 200") from None
        if min_new < 1:
            raise ValueError(f"TRAINING_ASSETS_RETRAIN_MIN_TRACES={min_new} must be >= 1 (1 = retrain on every batch)")
        cron = env.get("TRAINING_ASSETS_RETRAIN_CRON", "").strip()
        if cron:
            from dagster._utils.schedules import is_valid_cron_string  # no public validator in 1.13

            if not is_valid_cron_string(cron):
                raise ValueError(f"TRAINING_ASSETS_RETRAIN_CRON={cron!r} is not a cron schedule (e.g. '0 3 * * *')")
        retrain_tok = env.get("TRAINING_ASSETS_RETRAIN_TOKENIZER", "0").strip().lower()
        if retrain_tok not in {"0", "1", "true", "false", ""}:
            raise ValueError(f"TRAINING_ASSETS_RETRAIN_TOKENIZER={retrain_tok!r}: use 1 or 0")
        return cls(min_new, cron, retrain_tok in {"1", "true"})

    def describe(self) -> str:
        when = f">= {self.min_new_traces} new valid trace(s) since the asset's last training"
        if self.cron:
            when = f"a tick of cron '{self.cron}' (UTC) has passed and {when}"
        return when + ("; tokenizer follows the corpus" if self.retrain_tokenizer else "; tokenizer kept fixed")


def new_valid_traces(instance: dg.DagsterInstance, since_storage_id: int | None) -> dict[str, int]:
    """Batch id -> valid traces, for batches whose signatures were first staged after ``since_storage_id``.

    A batch reaches ``minhash_signatures`` only when its blocking quarantine check passed, so these
    are batches that entered the corpus. A partition re-materialised later (a backfill) is not new.
    """
    key = dg.AssetKey(SIGNATURES_ASSET)
    latest: dict[str, int] = {}
    cursor = None
    while True:
        page = instance.fetch_materializations(
            dg.AssetRecordsFilter(asset_key=key, after_storage_id=since_storage_id), limit=_PAGE, cursor=cursor,
            ascending=True)
        for record in page.records:
            materialization = record.asset_materialization
            documents = materialization.metadata.get("documents") if materialization else None
            if record.partition_key and documents is not None:
                latest[record.partition_key] = int(documents.value)
        if not page.has_more:
            break
        cursor = page.cursor
    if since_storage_id is None or not latest:
        return latest
    for partition in sorted(latest):
        earlier = instance.fetch_materializations(
            dg.AssetRecordsFilter(asset_key=key, asset_partitions=[partition], before_storage_id=since_storage_id),
            limit=1).records
        if earlier:
            del latest[partition]
    return latest


def last_materialization_storage_id(instance: dg.DagsterInstance, key: dg.AssetKey) -> int | None:
    records = instance.fetch_materializations(key, limit=1).records
    return records[0].storage_id if records else None


class NewValidTraces(dg.AutomationCondition):
    """True when at least ``minimum`` valid traces arrived (in curated batches) since the target's last materialisation."""

    def __init__(self, minimum: int):
        self.minimum = minimum

    @property
    def name(self) -> str:
        return f"new_valid_traces >= {self.minimum}"

    @property
    def description(self) -> str:
        return (f"Retraining policy: at least {self.minimum} valid trace(s) in batches whose signatures were staged "
                "after this asset's latest materialisation (a batch that failed its quarantine check never counts)")

    def get_label(self) -> str | None:
        return self.name

    def evaluate(self, context: dg.AutomationContext) -> dg.AutomationResult:
        instance = context.asset_graph_view.instance
        since = last_materialization_storage_id(instance, context.key)
        batches = new_valid_traces(instance, since)
        total = sum(batches.values())
        context.log.debug(f"{context.key.to_user_string()}: {total} new valid trace(s) in {len(batches)} batch(es) "
                         f"since its last training (policy: >= {self.minimum})")
        subset = context.candidate_subset if total >= self.minimum else context.get_empty_subset()
        return dg.AutomationResult(context, true_subset=subset)


AC = dg.AutomationCondition


def _guards(ignore: tuple[str, ...] = (), allow_missing: tuple[str, ...] = ()) -> dg.AutomationCondition:
    """Nothing in progress, nothing missing, every upstream blocking check passed (``ignore``: deps left out)."""
    selection = dg.AssetSelection.assets(*ignore) if ignore else None
    missing_sel = dg.AssetSelection.assets(*(ignore + allow_missing)) if ignore + allow_missing else None
    deps_missing = AC.any_deps_missing()
    deps_in_progress = AC.any_deps_in_progress()
    checks = AC.all_deps_blocking_checks_passed()
    if missing_sel is not None:
        deps_missing = deps_missing.ignore(missing_sel)
    if selection is not None:
        deps_in_progress = deps_in_progress.ignore(selection)
        checks = checks.ignore(selection)
    return ~deps_missing & ~deps_in_progress & ~AC.in_progress() & checks


def _updated(ignore: tuple[str, ...] = ()) -> dg.AutomationCondition:
    trigger = AC.any_deps_updated()
    if ignore:
        trigger = trigger.ignore(dg.AssetSelection.assets(*ignore))
    return trigger.since_last_handled().with_label("a dependency updated since last handled")


def batch_condition() -> dg.AutomationCondition:
    """minhash_signatures[batch]: its raw_traces partition updated and passed the quarantine check."""
    return (_updated() & _guards()).with_label("follow raw_traces when its quarantine check passes")


def follow_condition(ignore: tuple[str, ...] = ()) -> dg.AutomationCondition:
    """Not training: run after a dependency updates, once nothing upstream is missing, running or failing."""
    return (_updated(ignore) & _guards(ignore)).with_label("follow upstream (nothing missing, running or failing)")


def corpus_condition() -> dg.AutomationCondition:
    """curated_corpus: a batch's signatures (or the held-out sets) updated; at least one batch curated.

    ``raw_traces`` updates are ignored (each batch arrives through its signatures), and partitions
    of ``minhash_signatures`` that will never exist (a quarantined batch) do not count as missing.
    """
    some_batch = AC.any_deps_match(~AC.missing()).allow(dg.AssetSelection.assets(SIGNATURES_ASSET)).with_label(
        "at least one batch has signatures")
    return (_updated((BATCH_ASSET,)) & _guards((BATCH_ASSET,), (SIGNATURES_ASSET,)) & some_batch).with_label(
        "curate when a batch's signatures are staged")


def once_condition() -> dg.AutomationCondition:
    """Materialise once, when missing (held_out_sets; the tokenizer under the default policy)."""
    # stateless: a failed run is not retried in a loop (execution_failed) and never twice at once (in_progress)
    return (AC.missing() & ~AC.execution_failed() & _guards()).with_label("materialise once, when missing")


def tokenizer_condition(policy: RetrainingPolicy) -> dg.AutomationCondition:
    if policy.retrain_tokenizer:
        return follow_condition().with_label("tokenizer follows the corpus (TRAINING_ASSETS_RETRAIN_TOKENIZER=1)")
    return once_condition().with_label("tokenizer kept fixed: trained once; materialise it by hand to retrain")


def base_model_condition() -> dg.AutomationCondition:
    """base_checkpoint: pretrained once per tokenizer (when missing, or when the tokenizer changed).

    New traces retrain the fine-tuned chain (sft → dpo/grpo → merge) under the policy; pretraining
    from scratch on every batch would throw the base away each time. Materialise it by hand to
    re-pretrain on the grown corpus.
    """
    tokenizer_changed = AC.any_deps_updated().allow(dg.AssetSelection.assets("tokenizer")).since_last_handled()
    return ((AC.missing() & ~AC.execution_failed()) | tokenizer_changed.with_label("the tokenizer changed")
            ).with_label("missing, or the tokenizer changed") & _guards()


def training_condition(policy: RetrainingPolicy) -> dg.AutomationCondition:
    """A training asset: the retraining policy holds, a dependency updated, nothing missing/running/failing."""
    due = NewValidTraces(policy.min_new_traces)
    if policy.cron:
        due = (AC.cron_tick_passed(policy.cron).since_last_handled().with_label(f"cron '{policy.cron}' ticked")
               & due).with_label(f"retraining policy: {policy.describe()}")
    return (due & _updated() & _guards()).with_label(f"train when the retraining policy holds ({policy.describe()})")


POLICY = RetrainingPolicy.from_env()

# How often the daemon evaluates the conditions; tests shorten it. TRAINING_ASSETS_AUTOMATION=stopped
# starts the sensor stopped (a deployment that launches by hand, or a test about something else).
AUTOMATION_INTERVAL_S = int(os.environ.get("TRAINING_ASSETS_AUTOMATION_INTERVAL_S", "30"))
_SENSOR_STATUS = os.environ.get("TRAINING_ASSETS_AUTOMATION", "running").strip().lower()
if _SENSOR_STATUS not in {"running", "stopped"}:
    raise ValueError(f"TRAINING_ASSETS_AUTOMATION={_SENSOR_STATUS!r}: use 'running' (default) or 'stopped'")

# Evaluated in the code server (use_user_code_server): NewValidTraces is project code the daemon cannot
# deserialize. Assets without a condition of their own (registry_entry) follow their upstream.
training_automation_sensor = dg.AutomationConditionSensorDefinition(
    "training_automation_sensor",
    target=dg.AssetSelection.all() - dg.AssetSelection.assets(BATCH_ASSET),
    default_status=dg.DefaultSensorStatus.RUNNING if _SENSOR_STATUS == "running" else dg.DefaultSensorStatus.STOPPED,
    minimum_interval_seconds=AUTOMATION_INTERVAL_S,
    use_user_code_server=True,
    default_condition=follow_condition(),
    description=f"Carries each new trace batch through the graph. Retraining policy: {POLICY.describe()}.",
)
