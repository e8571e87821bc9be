"""The agent surface's contract: tool names, annotations, output schemas, personas, the workflow, the skill."""

import re
import subprocess
import sys

import anyio
import pytest
import yaml

from training_assets.agent import personas, workflow
from training_assets.agent.server import SKILL_PATH, build_server
from training_assets.agent.tools import TOOLS

# issue 11: the seed's tools and the platform's own, exactly these names
ISSUE_TOOLS = {
    "curate_corpus", "dedup_corpus", "decontaminate_corpus", "dataset_lineage", "train_tokenizer",
    "build_training_dataset", "compose_reward", "pretrain_model", "train_sft", "train_dpo", "train_grpo", "train_kto",
    "train_orpo",
    "merge_adapters_ties", "execute_workflow", "evaluate_checkpoint", "register_model", "registry_list",
    "pick_for_role", "rollback_role", "list_assets", "get_run", "cancel_run",
}
READ_ONLY = {"dataset_lineage", "registry_list", "pick_for_role", "list_assets", "get_run"}
NOT_REPEATABLE = {"register_model", "rollback_role", "execute_workflow", "cancel_run"}


def listed_tools(server):
    return anyio.run(server.list_tools)


def test_the_server_exposes_exactly_the_issue_tools_with_annotations_and_output_schemas():
    tools = {t.name: t for t in listed_tools(build_server())}
    assert set(tools) == ISSUE_TOOLS == set(TOOLS)
    for name, t in tools.items():
        assert t.output_schema and t.output_schema.get("type") == "object", name
        assert t.description.strip(), name
        assert t.annotations.read_only_hint is (name in READ_ONLY), name
        if name not in READ_ONLY:  # registering, rollback and every tool that executes
            assert t.annotations.destructive_hint is True, name
            assert t.annotations.idempotent_hint is (name not in NOT_REPEATABLE), name
    for name in ISSUE_TOOLS - READ_ONLY - {"dataset_lineage", "cancel_run", "rollback_role"}:
        assert {"options"} <= set(tools[name].input_schema["properties"]), name
        if name != "execute_workflow":
            assert "config" in tools[name].input_schema["properties"], name


def test_building_and_listing_the_server_imports_no_torch_dagster_or_mlflow():
    code = ("import sys, anyio\nfrom training_assets.agent.server import build_server\n"
            "s = build_server(persona='training_engineer')\nanyio.run(s.list_tools)\n"
            "heavy = [m for m in ('torch', 'transformers', 'mlflow', 'dagster') if m in sys.modules]\n"
            "assert not heavy, heavy\nprint('clean')\n")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0 and "clean" in done.stdout, done.stderr


def test_personas_are_data_with_their_own_tools_and_form_the_team():
    team = personas.load_team()
    assert team.name == "model_training_team" and team.workflow == "train_model"
    assert set(team.members) == {"data_curator", "training_engineer", "eval_judge", "ml_orchestrator"}
    for name in team.members:
        persona = personas.load_persona(name)
        assert persona.role and persona.goal and persona.instructions
        assert set(persona.tools) <= ISSUE_TOOLS, name
    assert personas.owners_of("evaluate_checkpoint") == ["eval_judge"]  # only the judge returns verdicts
    for tool in ("execute_workflow", "register_model", "rollback_role"):
        assert personas.owners_of(tool) == ["ml_orchestrator"], tool
    with pytest.raises(KeyError, match="unknown persona"):
        personas.load_persona("model_training_team")


@pytest.mark.parametrize("persona", ["data_curator", "training_engineer", "eval_judge", "ml_orchestrator"])
def test_a_persona_server_lists_only_its_tools_and_its_prompt(persona):
    server = build_server(persona=persona)
    assert {t.name for t in listed_tools(server)} == set(personas.load_persona(persona).tools)
    prompts = {p.name for p in anyio.run(server.list_prompts)}
    assert prompts == set(personas.persona_names())


def test_the_workflow_is_declared_in_the_seeds_order_over_real_assets_and_tools():
    from training_assets.orchestration.catalog import describe_graph

    graph = describe_graph()
    spec = workflow.load_workflow("train_model")
    assert [s.name for s in spec.stages] == ["prepare_corpus", "curate", "train_tokenizer", "build_datasets", "train",
                                             "eval", "align", "align_eval", "merge_adapters", "final_eval",
                                             "register_model"]
    for stage in spec.stages:
        parts = [stage, *stage.variants.values()]
        assert stage.owner in personas.persona_names()
        for part in parts:
            assert part.tool is None or (part.tool in TOOLS and part.tool in personas.load_persona(stage.owner).tools)
            assert set(part.assets) <= set(graph), stage.name
            for gate in part.gates:
                assert gate.check in {c["name"] for c in graph[gate.asset]["checks"] if c["blocking"]}
    every = {a for s in spec.stages for part in [s, *s.variants.values()] for a in part.assets}
    assert every == set(graph), "every asset of the graph belongs to one stage"


def test_the_skill_has_front_matter_and_names_only_real_tools():
    text = SKILL_PATH.read_text()
    match = re.match(r"^---\n(.*?)\n---\n", text, re.S)
    assert match, "SKILL.md starts with YAML front matter"
    front = yaml.safe_load(match.group(1))
    assert front["name"] == "train_model" and len(front["description"]) > 20
    called = set(re.findall(r"`([a-z_]+)\(", text))  # `tool(...)`: every call names a real tool
    assert called and called <= ISSUE_TOOLS, called - ISSUE_TOOLS
    mentioned = set(re.findall(r"`([a-z_]+)`", text)) & ISSUE_TOOLS
    stage_tools = {part.tool for s in workflow.load_workflow("train_model").stages
                   for part in [s, *s.variants.values()] if part.tool}
    assert stage_tools <= called | mentioned, "the skill covers every tool the workflow's stages use"
