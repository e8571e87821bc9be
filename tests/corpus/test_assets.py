"""The corpus assets materialise on the sample data with default config; checks pass and block."""

import dagster as dg

from training_assets.defs.corpus.assets import (
    DEDUP_RATE_CHECK,
    NO_OVERLAP_CHECK,
    curated_corpus,
    held_out_sets,
    minhash_signatures,
)
from training_assets.defs.partitions import trace_batches
from training_assets.defs.resources import DataRoot


def _checks(result):
    return {e.asset_check_evaluation_data.check_name: e.asset_check_evaluation_data.passed
            for e in result.all_events if e.event_type_value == "ASSET_CHECK_EVALUATION"}


def test_held_out_signatures_and_corpus_materialise_with_passing_checks(sample_root):
    root, batch_ids = sample_root
    instance = dg.DagsterInstance.ephemeral()
    instance.add_dynamic_partitions(trace_batches.name, batch_ids)
    resources = {"data_root": DataRoot(path=str(root))}
    assert dg.materialize([held_out_sets], resources=resources, instance=instance).success
    for batch_id in batch_ids:
        assert dg.materialize([minhash_signatures], partition_key=batch_id, resources=resources, instance=instance).success
    result = dg.materialize([curated_corpus], resources=resources, instance=instance)
    assert result.success
    assert _checks(result) == {NO_OVERLAP_CHECK: True, DEDUP_RATE_CHECK: True}
    (mat,) = result.asset_materializations_for_node("curated_corpus")
    meta = mat.metadata
    assert meta["signatures"].value["computed"] == 0  # every partition came from the store
    assert "held_out_overlap" in meta["drop_reasons"].value and "data:image/png;base64" in meta["cluster_sizes"].value
    assert meta["uri"].value == str(root / "curated_corpus")


def test_dedup_rate_check_fails_outside_its_bounds(sample_root):
    root, _ = sample_root
    resources = {"data_root": DataRoot(path=str(root))}
    assert dg.materialize([held_out_sets], resources=resources).success
    result = dg.materialize([curated_corpus], resources=resources, raise_on_error=False,
                            run_config={"ops": {"curated_corpus": {"config": {"max_dedup_rate": 0.01}}}})
    assert _checks(result)[DEDUP_RATE_CHECK] is False
