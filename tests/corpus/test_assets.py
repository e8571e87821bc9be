"""The corpus assets materialise on the sample data with default config; checks pass and block;
the shingling both dedup assets use is declared once (the ``minhash`` resource)."""

import dagster as dg

from training_assets.defs.corpus.assets import (
    DEDUP_RATE_CHECK,
    NO_OVERLAP_CHECK,
    CuratedCorpusConfig,
    MinhashShingling,
    curated_corpus,
    held_out_sets,
    minhash_signatures,
)
from training_assets.defs.partitions import trace_batches
from training_assets.defs.resources import DataRoot


def _checks(result):
    return {e.asset_check_evaluation_data.check_name: e.asset_check_evaluation_data.passed
            for e in result.all_events if e.event_type_value == "ASSET_CHECK_EVALUATION"}


def _resources(root, **shingling):
    return {"data_root": DataRoot(path=str(root)), "minhash": MinhashShingling(**shingling)}


def _materialise_corpus(root, batch_ids, **shingling):
    instance = dg.DagsterInstance.ephemeral()
    instance.add_dynamic_partitions(trace_batches.name, batch_ids)
    resources = _resources(root, **shingling)
    assert dg.materialize([held_out_sets], resources=resources, instance=instance).success
    for batch_id in batch_ids:
        assert dg.materialize([minhash_signatures], partition_key=batch_id, resources=resources, instance=instance).success
    return dg.materialize([curated_corpus], resources=resources, instance=instance)


def test_held_out_signatures_and_corpus_materialise_with_passing_checks(sample_root):
    root, batch_ids = sample_root
    result = _materialise_corpus(root, batch_ids)
    assert result.success
    assert _checks(result) == {NO_OVERLAP_CHECK: True, DEDUP_RATE_CHECK: True}
    (mat,) = result.asset_materializations_for_node("curated_corpus")
    meta = mat.metadata
    assert meta["signatures"].value["computed"] == 0  # every partition came from the store
    reasons = {r.data["reason"]: r.data["count"] for r in meta["drop_reasons"].value.records}
    assert reasons["decontaminate/held_out_overlap"] == 2
    assert meta["dagster/row_count"].value == meta["records"].value
    assert "data:image/png;base64" in meta["cluster_sizes"].value
    assert meta["uri"].value == str(root / "curated_corpus")


def test_shingling_is_declared_once_so_both_assets_agree(sample_root):
    """A non-default shingling set on the one resource reaches both assets: the corpus reuses
    every stored signature instead of finding them stale."""
    root, batch_ids = sample_root
    result = _materialise_corpus(root, batch_ids, ngram=3, num_perm=64, seed=7)
    assert result.success
    (mat,) = result.asset_materializations_for_node("curated_corpus")
    store = mat.metadata["signatures"].value
    assert store["computed"] == 0 and set(store["partitions"].values()) == {"stored"}
    assert not {"ngram", "num_perm", "seed"} & set(CuratedCorpusConfig.model_fields)


def test_dedup_rate_check_fails_outside_its_bounds(sample_root):
    root, _ = sample_root
    resources = _resources(root)
    assert dg.materialize([held_out_sets], resources=resources).success
    result = dg.materialize([curated_corpus], resources=resources, raise_on_error=False,
                            run_config={"ops": {"curated_corpus": {"config": {"max_dedup_rate": 0.01}}}})
    assert _checks(result)[DEDUP_RATE_CHECK] is False
