"""The tokenizer and dataset assets materialise through Dagster with passing blocking checks."""

import shutil

import dagster as dg

from training_assets.defs.datasets import assets as dataset_assets
from training_assets.defs.resources import DataRoot
from training_assets.defs.tokenizer import assets as tokenizer_assets
from training_assets import kinds
from training_assets.training_data import builders, read_dataset_info

DATASETS = ["sft_dataset", "preference_pairs", "grpo_groups", "pretrain_windows"]


def test_materialise_tokenizer_and_datasets_with_checks(sample_root, tmp_path):
    root = tmp_path / "data"
    shutil.copytree(sample_root, root)
    shutil.rmtree(root / "tokenizer")
    assets = [tokenizer_assets.tokenizer, *dataset_assets.dataset_assets]
    run_config = {"ops": {"tokenizer": {"config": {"vocab_size": 1024}}}}
    result = dg.materialize(assets, resources={"data_root": DataRoot(path=str(root))}, run_config=run_config,
                            instance=dg.DagsterInstance.ephemeral())
    assert result.success
    checks = result.get_asset_check_evaluations()
    dataset_checks = sum(len(builders.BUILDERS[d].checks) for d in kinds.DATASETS)
    assert len(checks) == 4 + dataset_checks and all(c.passed for c in checks)  # the tokenizer's 4, each builder's
    versions = {m.asset_key.to_user_string(): m for m in result.get_asset_materialization_events()}
    assert (root / "tokenizer" / "tokenizer.json").is_file()
    for name in DATASETS:
        info = read_dataset_info(name, root)
        tags = versions[name].materialization.tags or {}
        assert tags.get("dagster/data_version") == info.data_version
        assert versions[name].materialization.metadata["rows"].value == info.rows > 0
