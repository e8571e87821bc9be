"""Errors a tool reports to its caller: one line naming the input (or asset, or run) and the fix."""

from __future__ import annotations


class AgentError(Exception):
    """A request the platform refuses; the message is what the caller sees (no traceback)."""


class ToolInputError(AgentError):
    """A tool argument is wrong: ``field`` names it (``config.max_steps``), ``message`` says what to do."""

    def __init__(self, field: str, message: str) -> None:
        super().__init__(f"{field}: {message}")
        self.field = field
