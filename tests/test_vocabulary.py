"""One vocabulary: every layer's names for a training kind come from ``training_assets.kinds``, and every
setting's default and help from its one settings model."""

import importlib

import dagster as dg
import pytest

from training_assets import kinds, settings
from training_assets.cli import build_parser
from training_assets.definitions import defs
from training_assets.trainers import objectives


def _asset_keys() -> set[str]:
    return {k.to_user_string() for k in defs.resolve_asset_graph().get_all_asset_keys()}


def _config_fields(asset: str) -> dict:
    """field -> (default, description) of an asset's Dagster run config."""
    fields = defs.get_assets_def(asset).op.config_schema.as_field().config_type.fields
    return {name: (field.default_value if field.default_provided else None, field.description)
            for name, field in fields.items()}


@pytest.mark.parametrize("kind", kinds.KINDS.values(), ids=lambda k: k.name)
def test_each_kind_reaches_every_layer_by_the_tables_names(kind):
    assets = _asset_keys()
    assert {kind.dataset, kind.checkpoint} <= assets
    assert kind.gate is None or kind.gate in assets
    assert kind.upstream is None or kinds.is_checkpoint(kind.upstream)
    module, cls = kind.trainer.split(":")
    assert hasattr(importlib.import_module(f"training_assets.trainers.{module}"), cls)
    assert callable(getattr(objectives, kind.objective))
    assert kind.dataset in settings.DATASET_SETTINGS

    from training_assets.agent import personas
    from training_assets.agent.tools import TOOLS

    assert kind.tool in TOOLS and kind.tool in personas.load_persona(kind.persona).tools
    parents = {p.to_user_string() for p in defs.resolve_asset_graph().get(dg.AssetKey(kind.checkpoint)).parent_keys}
    assert kind.dataset in parents and (kind.upstream is None or kind.upstream in parents)


def test_cli_choices_are_the_kinds():
    parser = build_parser(["training", "datasets"])
    verbs = parser._subparsers._group_actions[0].choices
    train_kind = next(a for a in verbs["train"]._actions if a.dest == "kind")
    assert tuple(train_kind.choices) == kinds.KIND_NAMES
    build_kinds = next(a for a in verbs["build-dataset"]._actions if a.dest == "kind")
    assert tuple(build_kinds.choices) == kinds.KIND_NAMES


@pytest.mark.parametrize("dataset", sorted(settings.DATASET_SETTINGS))
def test_a_dataset_setting_has_one_default_and_one_help_in_dagster_and_the_cli(dataset):
    model = settings.DATASET_SETTINGS[dataset]
    expected = {name: (info.get_default(call_default_factory=True), info.description)
                for name, info in model.model_fields.items()}
    assert _config_fields(dataset) == expected
    parser = build_parser(["datasets"])
    sub = parser._subparsers._group_actions[0].choices["build-dataset"]
    kind = kinds.kind_of_dataset(dataset).name
    options = {a.dest.removeprefix("opt__") for a in sub._subparsers._group_actions[0].choices[kind]._actions
               if a.dest.startswith("opt__")}
    assert options == set(expected)


def test_a_checkpoint_config_field_carries_the_library_help_and_default_unless_the_demo_changes_it():
    from training_assets.defs.training.assets import demo_defaults
    from training_assets.trainers import LoraSpec, TrainConfig

    for kind in kinds.KINDS.values():
        demo = demo_defaults(kind)
        for name, (default, help_text) in _config_fields(kind.checkpoint).items():
            if name not in TrainConfig.model_fields or name == kind.spec:
                continue
            info = TrainConfig.model_fields[name]
            assert help_text == info.description, (kind.name, name)
            expected = demo.get(name, info.get_default(call_default_factory=True))
            if name == "lora" and expected is not None:  # Dagster shows every LoraSpec field: the rest its defaults
                assert LoraSpec(**default) == LoraSpec(**expected), kind.name
                continue
            assert default == expected, (kind.name, name)


def _as_config(value):
    """A default as Dagster's config holds it (tuples are lists there)."""
    return list(value) if isinstance(value, tuple) else value


def _dagster_fields(config_class) -> dict:
    return {name: (info.get_default(call_default_factory=True), info.description)
            for name, info in config_class.model_fields.items()}


def _expected(model, names=None, defaults=None) -> dict:
    """field -> (default, help) of a library settings model, ``defaults`` being a layer's documented changes."""
    return {name: (_as_config((defaults or {}).get(name, info.get_default(call_default_factory=True))),
                   info.description)
            for name, info in model.model_fields.items() if names is None or name in names}


def _cli_options(module: str, verb: str) -> dict:
    """option field -> help of a verb's options derived from a settings model (``opt__<field>``)."""
    sub = build_parser([module])._subparsers._group_actions[0].choices[verb]
    return {a.dest.removeprefix("opt__"): a.help for a in sub._actions if a.dest.startswith("opt__")}


def _assert_cli_derives(options: dict, *models) -> None:
    expected = {name: info.description for model in models for name, info in model.model_fields.items()}
    assert set(options) == set(expected)
    for name, help_text in options.items():
        assert help_text.startswith(expected[name]), name


def test_a_curation_setting_has_one_default_and_one_help_in_dagster_and_the_cli():
    from training_assets import data_engine
    from training_assets.commands import corpus as corpus_verbs
    from training_assets.data_engine.corpus import HeldOutConfig
    from training_assets.defs.corpus.assets import CURATION_FIELDS, CuratedCorpusConfig, HeldOutSetsConfig

    fields = _dagster_fields(CuratedCorpusConfig)
    assert {k: fields[k] for k in data_engine.QualityConfig.model_fields} == _expected(data_engine.QualityConfig)
    assert {k: fields[k] for k in CURATION_FIELDS} == _expected(data_engine.CurationConfig, CURATION_FIELDS)
    assert _dagster_fields(HeldOutSetsConfig) == _expected(HeldOutConfig)
    _assert_cli_derives(_cli_options("corpus", "curate"), data_engine.QualityConfig, corpus_verbs.CURATE_FIELDS)
    _assert_cli_derives(_cli_options("corpus", "dedup"), corpus_verbs.DEDUP_FIELDS)
    _assert_cli_derives(_cli_options("corpus", "decontaminate"), corpus_verbs.DECONTAM_FIELDS)
    assert set(corpus_verbs.CURATE_FIELDS.model_fields) == set(CURATION_FIELDS) - {"extra_sources"}  # --extra FILES


def test_an_eval_setting_has_one_default_and_one_help_in_dagster_and_the_cli_but_the_demos_changes():
    from training_assets import evaluation
    from training_assets.defs.evaluation import assets
    from training_assets.evaluation.settings import RUN_FIELDS

    variants = [(assets.EvalReportConfig, assets.DEMO_RUN, assets.DEMO_GATE),
                (assets.AlignedEvalConfig, assets.ALIGNED_RUN, assets.ALIGNED_GATE),
                (assets.PromotionEvalConfig, assets.DEMO_RUN, assets.DEMO_GATE)]
    for config_class, run, gate in variants:
        fields = _dagster_fields(config_class)
        assert {k: fields[k] for k in RUN_FIELDS} == _expected(evaluation.EvalSettings, RUN_FIELDS, run)
        assert ({k: fields[k] for k in evaluation.GateThresholds.model_fields}
                == _expected(evaluation.GateThresholds, defaults=gate)), config_class.__name__
        assert set(fields) - set(RUN_FIELDS) - set(evaluation.GateThresholds.model_fields) <= {
            "cases_path", "role", "model_name"}
    from training_assets.commands.evaluation import EVAL_RUN_FIELDS

    _assert_cli_derives(_cli_options("evaluation", "evaluate"), EVAL_RUN_FIELDS, evaluation.GateThresholds)
    assert set(EVAL_RUN_FIELDS.model_fields) == set(RUN_FIELDS)


def test_a_tokenizer_setting_has_one_default_and_one_help_in_dagster_and_the_cli():
    from training_assets.defs.tokenizer.assets import TokenizerAssetConfig
    from training_assets.tokenizer_trainer import TokenizerConfig

    assert _dagster_fields(TokenizerAssetConfig) == _expected(TokenizerConfig)
    _assert_cli_derives(_cli_options("datasets", "train-tokenizer"), TokenizerConfig)


def test_the_loop_and_the_agentic_gate_take_their_settings_from_one_model_each():
    from training_assets.defs.evaluation.agentic import AgenticEvalConfig
    from training_assets.evaluation.agentic import AgenticSettings
    from training_assets.settings import LoopSettings

    _assert_cli_derives(_cli_options("loop", "loop"), LoopSettings)
    fields = _dagster_fields(AgenticEvalConfig)
    assert {k: fields[k] for k in AgenticSettings.model_fields} == _expected(AgenticSettings)
    assert set(fields) - set(AgenticSettings.model_fields) == {"tasks_path", "role", "model_name"}
