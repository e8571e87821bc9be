"""The harness's one error type: its message is one line naming the input and the fix."""

from __future__ import annotations


class HarnessError(RuntimeError):
    """A run cannot go on (bad client URL, server down, unwritable batch); the message says why and what to do."""
