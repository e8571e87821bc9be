"""The automation conditions on the real asset graph, evaluated tick by tick against an ephemeral instance.

Materialisations and check results are reported into the instance (as a run would record them), so
each tick shows what the daemon would launch: a new batch flows to the registry, a quarantined
batch stops at its check, nothing is requested twice for the same inputs, the tokenizer stays
fixed and the retraining policy holds training back until enough new traces arrived.
"""

import dagster as dg
import pytest
from dagster._core.definitions.asset_checks.asset_check_evaluation import AssetCheckEvaluationTargetMaterializationData

from training_assets import kinds
from training_assets.defs import automation
from training_assets.definitions import defs

GRAPH = defs.resolve_asset_graph()
CORPUS_CHAIN = {"curated_corpus", "selected_traces", *kinds.DATASETS}
TRAINING = {*kinds.CHECKPOINTS, "merged_adapter"}
EVALS = {*(k.gate for k in kinds.KINDS.values() if k.gate), "merged_eval_report", "agentic_eval_report"}


class Ticks:
    """Evaluate the conditions tick after tick (carrying the cursor, as the sensor does)."""

    def __init__(self, assets):
        self.instance = dg.DagsterInstance.ephemeral()
        self.assets = assets
        self.cursor = None

    def tick(self) -> dict[str, set]:
        result = dg.evaluate_automation_conditions(defs=self.assets, instance=self.instance, cursor=self.cursor)
        self.cursor = result.cursor
        out = {}
        for key in GRAPH.materializable_asset_keys:
            requested = result.get_requested_partitions(key)
            if requested:
                out[key.to_user_string()] = requested
        return out

    def materialize(self, names, partition=None, documents=None, checks_pass=True):
        """Record what a successful run of ``names`` writes: a materialisation and each blocking check's result."""
        for name in names:
            key = dg.AssetKey(name)
            metadata = {"documents": documents} if documents is not None else {}
            self.instance.report_runless_asset_event(dg.AssetMaterialization(key, partition=partition, metadata=metadata))
            record = self.instance.fetch_materializations(
                dg.AssetRecordsFilter(key, asset_partitions=[partition] if partition else None), limit=1).records[0]
            target = AssetCheckEvaluationTargetMaterializationData(
                storage_id=record.storage_id, run_id=record.run_id, timestamp=record.timestamp)
            for check in GRAPH.get(key).check_keys:  # each check evaluates this materialisation, as in its run
                self.instance.report_runless_asset_event(dg.AssetCheckEvaluation(
                    asset_key=key, check_name=check.name, passed=checks_pass, partition=partition,
                    target_materialization_data=target))

    def add_batch(self, batch_id: str):
        self.instance.add_dynamic_partitions("trace_batches", [batch_id])


def _assets(policy: automation.RetrainingPolicy):
    """The project's assets with the training and tokenizer conditions built from ``policy``."""
    training = automation.training_condition(policy)
    tokenizer = automation.tokenizer_condition(policy)
    def condition(spec: dg.AssetSpec) -> dg.AssetSpec:
        name = spec.key.to_user_string()
        if name in TRAINING - {"base_checkpoint"}:
            return spec.replace_attributes(automation_condition=training)
        if name == "tokenizer":
            return spec.replace_attributes(automation_condition=tokenizer)
        if name == "registry_entry":  # the sensor's default_condition, given explicitly to the tester
            return spec.replace_attributes(automation_condition=automation.follow_condition())
        return spec

    return dg.Definitions(assets=[a.map_asset_specs(condition) if isinstance(a, dg.AssetsDefinition) else a
                                  for a in defs.assets], resources=defs.resources)


def _first_batch(t: Ticks) -> dict[str, set]:
    # before any batch: only the roots (the held-out sets and the base model's record), once
    assert t.tick() == {"held_out_sets": {None}, "base_model": {None}}
    t.materialize(["held_out_sets", "base_model"])
    t.add_batch("b1")
    t.materialize(["raw_traces"], partition="b1")
    assert t.tick() == {"minhash_signatures": {"b1"}}
    t.materialize(["minhash_signatures"], partition="b1", documents=40)
    return t.tick()


def test_a_batch_flows_to_the_registry_once_and_a_quarantined_batch_stops():
    t = Ticks(_assets(automation.RetrainingPolicy()))
    chain = _first_batch(t)
    everything = CORPUS_CHAIN | {"tokenizer"} | TRAINING | EVALS | {"registry_entry"}
    assert set(chain) == everything, set(chain) ^ everything
    t.materialize(sorted(everything))
    assert t.tick() == {}  # the same inputs never run twice

    t.add_batch("bad")
    t.materialize(["raw_traces"], partition="bad", checks_pass=False)
    assert t.tick() == {}  # quarantine check failed: no signatures, nothing downstream
    assert t.tick() == {}

    t.add_batch("b2")
    t.materialize(["raw_traces"], partition="b2")
    assert t.tick() == {"minhash_signatures": {"b2"}}
    t.materialize(["minhash_signatures"], partition="b2", documents=5)
    second = t.tick()
    # the tokenizer stays fixed under the default policy, and so the base model pretrained on it
    assert set(second) == everything - {"tokenizer", "base_checkpoint"}, set(second)


def test_the_policy_holds_training_until_enough_new_traces():
    t = Ticks(_assets(automation.RetrainingPolicy(min_new_traces=30)))
    chain = _first_batch(t)  # 40 valid traces >= 30: the first training
    assert TRAINING <= set(chain)
    t.materialize(sorted(chain))
    assert t.tick() == {}
    t.materialize(["tokenizer"])  # retrained by hand: the base model follows its tokenizer
    # what reads the tokenizer follows it; training past the base waits for the policy (no new traces)
    retokenized = {"base_checkpoint", "sft_dataset", "pretrain_windows"}
    assert set(t.tick()) == retokenized
    t.materialize(sorted(retokenized))
    assert t.tick() == {}

    for index, documents in enumerate((20, 15), start=2):
        t.add_batch(f"b{index}")
        t.materialize(["raw_traces"], partition=f"b{index}")
        assert t.tick() == {"minhash_signatures": {f"b{index}"}}
        t.materialize(["minhash_signatures"], partition=f"b{index}", documents=documents)
        requested = t.tick()
        if index == 2:  # 20 new traces < 30: data moves on, training waits
            assert set(requested) == CORPUS_CHAIN and not TRAINING & set(requested)
            t.materialize(sorted(requested))
        else:  # 20 + 15 = 35 >= 30 since the last training: train
            assert TRAINING - {"base_checkpoint"} <= set(requested) and not {"tokenizer", "base_checkpoint"} & set(requested)


def test_a_failed_gate_stops_what_follows_it():
    t = Ticks(_assets(automation.RetrainingPolicy()))
    chain = _first_batch(t)
    t.materialize(sorted(set(chain) - {"sft_eval_report"} - {"dpo_checkpoint", "grpo_checkpoint", "dpo_eval_report",
                                                         "grpo_eval_report", "merged_adapter", "merged_eval_report",
                                                         "agentic_eval_report", "registry_entry"}))
    t.materialize(["sft_eval_report"], checks_pass=False)  # the SFT gate failed in that run
    assert t.tick() == {}  # dpo/grpo are not retried on their own while the gate fails


@pytest.mark.parametrize("env, message", [
    ({"TRAINING_ASSETS_RETRAIN_MIN_TRACES": "many"}, "is not an integer"),
    ({"TRAINING_ASSETS_RETRAIN_MIN_TRACES": "0"}, "must be >= 1"),
    ({"TRAINING_ASSETS_RETRAIN_CRON": "every night"}, "is not a cron schedule"),
    ({"TRAINING_ASSETS_RETRAIN_TOKENIZER": "maybe"}, "use 1 or 0"),
])
def test_policy_settings_are_checked(env, message):
    with pytest.raises(ValueError, match=message):
        automation.RetrainingPolicy.from_env(env)


def test_policy_from_env_and_its_description_in_the_ui():
    policy = automation.RetrainingPolicy.from_env({"TRAINING_ASSETS_RETRAIN_MIN_TRACES": "200",
                                                   "TRAINING_ASSETS_RETRAIN_CRON": "0 3 * * *"})
    assert policy == automation.RetrainingPolicy(200, "0 3 * * *", False)
    label = automation.training_condition(policy).get_label()
    assert "0 3 * * *" in label and ">= 200 new valid trace" in label and "tokenizer kept fixed" in label
    sensor = defs.resolve_sensor_def("training_automation_sensor")
    assert sensor.default_status == dg.DefaultSensorStatus.RUNNING
    assert "Retraining policy" in sensor.description
