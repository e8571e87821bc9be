"""Fixtures for the agent surface: a Dagster home with the project's dagster.yaml (QueuedRunCoordinator,
no daemon), a data root with the sample traces in its inbox, and an in-memory MCP client."""

import shutil
import socket
import sys
from pathlib import Path
from typing import Any

import anyio
import pytest

REPO = Path(__file__).resolve().parents[2]
BIN = Path(sys.executable).parent


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def make_home(tmp: Path) -> Path:
    home = tmp / "dagster_home"
    home.mkdir(parents=True)
    shutil.copyfile(REPO / "dagster_home" / "dagster.yaml", home / "dagster.yaml")
    return home


def write_samples(root: Path) -> None:
    from training_assets import sample_traces

    sample_traces.write_samples(root)


def snapshot(root: Path) -> list[tuple[str, int, int]]:
    """Every file under ``root`` with its size and mtime: equal snapshots mean nothing was written."""
    return sorted((str(p.relative_to(root)), p.stat().st_size, p.stat().st_mtime_ns)
                  for p in root.rglob("*") if p.is_file())


def instance_runs(home: Path) -> list[Any]:
    """Every run in the instance at ``home``, read with a fresh instance of its own."""
    import dagster as dg

    instance = dg.DagsterInstance.from_config(str(home))
    try:
        return list(instance.get_runs())
    finally:
        instance.dispose()


def call(server: Any, name: str, args: dict[str, Any] | None = None, progress: Any = None) -> Any:
    """One tool call through the SDK's in-memory client."""
    from mcp import Client

    async def main() -> Any:
        async with Client(server) as client:
            return await client.call_tool(name, args or {}, progress_callback=progress)

    return anyio.run(main)


def calls(server: Any, steps: list[tuple[str, dict[str, Any]]]) -> list[Any]:
    """Several tool calls in one session (the server keeps serving after an error)."""
    from mcp import Client

    async def main() -> list[Any]:
        async with Client(server) as client:
            return [await client.call_tool(n, a) for n, a in steps]

    return anyio.run(main)


def error_text(result: Any) -> str:
    assert result.is_error, result.structured_content
    return result.content[0].text


@pytest.fixture
def agent_env(tmp_path, data_root, monkeypatch):
    """A fresh Dagster home (the project's dagster.yaml) and data root with the sample batches in the inbox."""
    home = make_home(tmp_path)
    monkeypatch.setenv("DAGSTER_HOME", str(home))
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    write_samples(data_root)
    return {"home": home, "root": data_root}

