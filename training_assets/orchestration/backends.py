"""Where runs go and how they are read back: the ``RunBackend`` protocol and the local backend.

    backend = LocalRuns()                                 # $DAGSTER_HOME, a detached worker per launch
    run_id = backend.launch(["sft_checkpoint"], run_config, tags)
    backend.get_run(run_id)["status"]                     # Dagster's own status names (vocabulary.py)

Both backends (``LocalRuns`` here, ``GraphQLRuns`` in ``graphql.py``) answer the same questions
with the same plain dicts, so the agent surface never sees which one it talks to. It imports no
dagster itself: ``LocalRuns`` loads ``catalog`` / ``local_runs`` on first use, so the
MCP server (which builds a backend at start) answers ``tools/list`` before dagster is imported.
The static graph (keys, parents, config fields) always comes from this package's Definitions,
for either backend: the MCP server runs the same code as the code location it drives.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from functools import cached_property
from typing import Any, Protocol


class RunBackend(Protocol):
    name: str

    def graph(self) -> dict[str, dict[str, Any]]: ...
    def config_class(self, asset: str) -> type | None: ...
    def asset_states(self, keys: Iterable[str] | None = None) -> dict[str, dict[str, Any]]: ...
    def launch(self, assets: Sequence[str], run_config: Mapping[str, Any], tags: Mapping[str, str],
               partition: str | None = None, wait: bool = False) -> str: ...
    def launch_sequence(self, runs: Sequence[dict[str, Any]]) -> list[str]: ...
    def get_run(self, run_id: str) -> dict[str, Any] | None: ...
    def run_events(self, run_id: str, max_lines: int = 20) -> dict[str, Any]: ...
    def find_runs(self, tags: Mapping[str, str]) -> list[dict[str, Any]]: ...
    def in_flight(self, assets: Iterable[str]) -> list[dict[str, Any]]: ...
    def cancel(self, run_id: str) -> str: ...
    def register_new_batches(self) -> list[str]: ...


class LocalRuns:
    """The instance at ``$DAGSTER_HOME``; each launch is executed by a detached worker process."""

    name = "local"

    @cached_property
    def _catalog(self) -> Any:
        from training_assets.orchestration import catalog  # dagster and the Definitions: seconds; the MCP server starts without them

        return catalog

    @cached_property
    def _runs(self) -> Any:
        from training_assets.orchestration import local_runs  # dagster: seconds; the MCP server starts without it

        return local_runs

    @cached_property
    def _graph(self) -> dict[str, dict[str, Any]]:
        return self._catalog.describe_graph()

    def graph(self) -> dict[str, dict[str, Any]]:
        return self._graph

    def config_class(self, asset: str) -> type | None:
        return self._catalog.config_class(asset)

    def asset_states(self, keys: Iterable[str] | None = None) -> dict[str, dict[str, Any]]:
        return self._catalog.asset_states(keys)

    def launch(self, assets: Sequence[str], run_config: Mapping[str, Any], tags: Mapping[str, str],
               partition: str | None = None, wait: bool = False) -> str:
        return self._runs.launch(list(assets), run_config, tags, partition=partition, detach=not wait)

    def launch_sequence(self, runs: Sequence[dict[str, Any]]) -> list[str]:
        return self._runs.launch_sequence(runs)

    def get_run(self, run_id: str) -> dict[str, Any] | None:
        return self._runs.get_run(run_id)

    def run_events(self, run_id: str, max_lines: int = 20) -> dict[str, Any]:
        return self._runs.run_events(run_id, max_lines)

    def find_runs(self, tags: Mapping[str, str]) -> list[dict[str, Any]]:
        return self._runs.find_runs(tags)

    def in_flight(self, assets: Iterable[str]) -> list[dict[str, Any]]:
        return self._runs.in_flight(assets)

    def cancel(self, run_id: str) -> str:
        return self._runs.cancel(run_id)

    def register_new_batches(self) -> list[str]:
        return self._catalog.register_new_batches()

    def warm_up(self) -> None:
        """Import dagster and load the Definitions (a few seconds), so the first tool call is quick."""
        self.graph()
        _ = self._runs
