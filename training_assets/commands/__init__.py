"""CLI verbs, one module per area; see ``training_assets.cli``."""

import json
import sys
from typing import Any


def emit(args: Any, payload: Any, text: str) -> None:
    """Print ``payload`` as JSON when ``--json`` was given, else the human text."""
    if getattr(args, "json", False):
        json.dump(payload, sys.stdout, indent=2, sort_keys=True, default=str)
        sys.stdout.write("\n")
    else:
        print(text)


def fail(message: str, code: int = 2) -> int:
    """Report a user error on stderr (no traceback) and return its exit code."""
    print(f"training-assets: error: {message}", file=sys.stderr)
    return code
