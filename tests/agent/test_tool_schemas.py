"""A tool's typed signature is its input schema: each tool's config is typed by the settings models of
what it materialises, accepts exactly the fields its assets' Dagster config takes, shows the same help
and defaults, and refuses an unknown field in one line."""

import anyio
import pytest

from tests.agent.conftest import call, error_text
from training_assets import kinds
from training_assets.agent import graph_map
from training_assets.agent.server import build_server
from training_assets.agent.tools import schemas


@pytest.fixture(scope="module")
def listed() -> dict:
    return {t.name: t for t in anyio.run(build_server().list_tools)}


@pytest.fixture(scope="module")
def graph() -> dict:
    from training_assets.orchestration.catalog import describe_graph  # dagster: the Definitions, for the comparison

    return describe_graph()


_SPEC_FIELDS = {k.spec for k in kinds.KINDS.values() if k.spec}


def _config_schema(tool) -> dict:
    """The object schema of a tool's ``config`` argument (``$ref`` resolved)."""
    prop = tool.input_schema["properties"]["config"]
    ref = next(s["$ref"] for s in prop["anyOf"] if "$ref" in s)
    return tool.input_schema["$defs"][ref.rsplit("/", 1)[-1]]


def _asset_fields(tool: str, graph: dict) -> dict[str, dict]:
    """field -> Dagster's {default, description} of what ``tool`` may set (every variant for kind/checkpoint tools)."""
    if tool == "build_training_dataset":
        targets = [(d,) for d in dict.fromkeys(graph_map.DATASET_KINDS.values())]
    elif tool == "evaluate_checkpoint":
        targets = [(r,) for r in graph_map.EVAL_REPORTS.values()]
    else:
        targets = [graph_map.tool_target(tool)]
    out: dict[str, list] = {}
    for assets in targets:
        for name, asset in graph_map.accepted_fields(tool, assets, graph).items():
            out.setdefault(name, []).append(graph[asset]["config"][name])
    return out


def _documented_changes(tool: str, graph: dict) -> dict[str, list]:
    """Defaults the demo deployment changes (defs/: a tiny model on CPU), per field: each is allowed to differ."""
    from training_assets.defs.evaluation import assets as eval_assets  # dagster: the demo's documented changes
    from training_assets.defs.training.assets import SPEC_DEFAULTS, demo_defaults  # dagster

    if tool in graph_map.TRAINING_TOOLS:
        kind = kinds.kind_of_tool(tool)
        changes = {k: [v] for k, v in demo_defaults(kind).items()}
        if kind.name in SPEC_DEFAULTS:
            changes[kind.spec] = [SPEC_DEFAULTS[kind.name]]
        return changes
    if tool == "evaluate_checkpoint":
        out: dict[str, list] = {}
        for d in (eval_assets.DEMO_RUN, eval_assets.DEMO_GATE, eval_assets.ALIGNED_RUN, eval_assets.ALIGNED_GATE):
            for k, v in d.items():
                out.setdefault(k, []).append(v)
        return out
    return {}


def test_every_config_is_a_typed_object_that_refuses_unknown_fields(listed):
    configured = {name for name, t in listed.items() if "config" in t.input_schema.get("properties", {})}
    assert configured == set(schemas.INPUTS)
    for name in configured:
        schema = _config_schema(listed[name])
        assert schema["type"] == "object" and schema["additionalProperties"] is False, name
        assert schema["properties"], name
        for field, prop in schema["properties"].items():
            assert prop.get("description"), (name, field)
            assert "default" in prop or "$ref" in prop or "anyOf" in prop, (name, field)
        assert "a plan lists every" in listed[name].input_schema["properties"]["config"]["description"].lower()


@pytest.mark.parametrize("tool", sorted(schemas.INPUTS))
def test_a_tools_config_fields_help_and_defaults_are_its_assets_dagster_configs(tool, listed, graph):
    model = schemas.input_model(tool)
    dagster = _asset_fields(tool, graph)
    assert set(model.model_fields) == set(dagster), tool
    schema = _config_schema(listed[tool])["properties"]
    changed = _documented_changes(tool, graph)
    for name, specs in dagster.items():
        info = model.model_fields[name]
        if name in _SPEC_FIELDS:  # defs/ words the kind-spec field itself ("dpo options (DpoSpec)"); its fields below
            continue
        for spec in specs:
            assert spec["description"].startswith(info.description), (tool, name)
        prop = schema[name]
        if "default" not in prop:  # a nested model: its own fields carry their defaults
            continue
        for spec in specs:
            if spec["default"] != prop["default"]:
                assert spec["default"] in changed.get(name, []) or isinstance(spec["default"], dict), (
                    tool, name, spec["default"], prop["default"])


def test_nested_defaults_are_the_library_models(listed):
    from training_assets.trainers import TrainConfig
    from training_assets.trainers.config import DpoSpec

    schema = listed["train_dpo"].input_schema
    dpo = schema["$defs"]["TrainDpoConfigDpo"]["properties"]
    assert {k: v["default"] for k, v in dpo.items()} == DpoSpec().model_dump(mode="json")
    lora = schema["$defs"]["TrainDpoConfigLora"]["properties"]
    assert lora["r"]["default"] == TrainConfig.model_fields["lora"].annotation.__args__[0]().r
    assert lora["r"]["exclusiveMinimum"] == 0


def test_only_the_fields_given_become_run_config(agent_env):
    result = call(build_server(), "train_sft", {"config": {"max_steps": 3, "lora": {"r": 4}}})
    assert not result.is_error, result.content
    plan = result.structured_content
    assert plan["run_config"]["ops"]["sft_checkpoint"]["config"] == {"max_steps": 3, "lora": {"r": 4}}
    assert plan["config_fields"]["max_steps"]["default"] == 6  # the deployment's default, not the library's


@pytest.mark.parametrize("tool, args, expected", [
    ("train_dpo", {"config": {"dpo": {"betta": 0.2}}}, "config.dpo.betta: unknown field for train_dpo; did you mean beta?"),
    ("dedup_corpus", {"config": {"thresold": 0.7}}, "config.thresold: unknown field for dedup_corpus; did you mean threshold?"),
    ("train_tokenizer", {"config": {"vocab_size": "big"}}, "config.vocab_size: Input should be a valid integer"),
    ("train_sft", {"config": {"lora": {"r": 0}}}, "config.lora.r: Input should be greater than 0"),
])
def test_an_unknown_or_bad_config_field_is_one_line_naming_it(agent_env, tool, args, expected):
    text = error_text(call(build_server(), tool, args))
    assert "\n" not in text and text.startswith(expected), text


def test_a_new_kind_needs_no_yaml_edit():
    from training_assets.agent import personas, workflow

    for kind in kinds.KINDS.values():
        assert kind.tool in personas.load_persona(kind.persona).tools
    spec = workflow.load_workflow()
    align = next(s for s in spec.stages if s.name == "align")
    assert set(align.variants) == set(spec.task["align"].choices) == set(kinds.KIND_NAMES) - {"sft", "pretrain"}
    for name, variant in align.variants.items():
        assert variant.tool == kinds.kind(name).tool and variant.assets == (kinds.kind(name).checkpoint,)
