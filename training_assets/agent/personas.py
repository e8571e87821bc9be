"""The four personas and their team, declared as YAML data in ``agent/personas/``.

    persona = load_persona("eval_judge")      # role, goal, instructions, tools
    team = load_team()                        # model_training_team: members, lead, workflow
    persona.system_prompt()                   # what an LLM driving this persona is told

A persona's ``tools`` is the whole of what ``training-assets mcp --persona NAME`` exposes: the
training tools of the kinds it owns (``training_assets.kinds``: a new kind needs no YAML edit),
then the tools its YAML lists.
"""

from __future__ import annotations

from functools import lru_cache
from pathlib import Path

import yaml
from pydantic import BaseModel, ConfigDict, Field

from training_assets import kinds

PERSONA_DIR = Path(__file__).resolve().parent / "personas"
TEAM_NAME = "model_training_team"


class Persona(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    name: str
    role: str
    goal: str
    instructions: str
    tools: tuple[str, ...] = Field(description="The only tools this persona may call.")

    def system_prompt(self) -> str:
        tools = ", ".join(self.tools)
        return (f"You are the {self.role} ({self.name}) of the {TEAM_NAME} on the training-assets platform.\n"
                f"Goal: {self.goal}\n\nHow you work:\n{self.instructions.strip()}\n\n"
                f"Your tools: {tools}. Every tool that writes data, trains or registers plans by default; "
                "pass options {\"execute\": true} to run it.")


class Team(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    name: str
    kind: str = "team"
    description: str
    lead: str
    members: tuple[str, ...]
    workflow: str


@lru_cache(maxsize=None)
def load_persona(name: str) -> Persona:
    path = PERSONA_DIR / f"{name}.yaml"
    if name == TEAM_NAME or not path.is_file():
        raise KeyError(f"unknown persona {name!r}; choose one of {list(persona_names())}")
    raw = yaml.safe_load(path.read_text(encoding="utf-8"))
    owned = [k.tool for k in kinds.KINDS.values() if k.persona == name]
    return Persona(**{**raw, "tools": tuple(dict.fromkeys([*owned, *raw.get("tools", ())]))})


@lru_cache(maxsize=None)
def load_team() -> Team:
    return Team(**yaml.safe_load((PERSONA_DIR / f"{TEAM_NAME}.yaml").read_text(encoding="utf-8")))


def persona_names() -> tuple[str, ...]:
    return load_team().members


def owners_of(tool: str) -> list[str]:
    """The personas that may call ``tool``."""
    return [p for p in persona_names() if tool in load_persona(p).tools]
