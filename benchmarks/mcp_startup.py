"""How fast `training-assets mcp` answers: launch -> tools/list over stdio, and launch -> run_id.

    .venv/bin/python benchmarks/mcp_startup.py              # 7 rounds
    .venv/bin/python benchmarks/mcp_startup.py --rounds 5 --no-execute

Each round launches, as an MCP client does, a fresh server process over stdio with the SDK's
client and times from the launch to the answer of ``tools/list`` for two servers, alternating
which goes first:

- ``bare``: an ``MCPServer`` with one trivial tool (the SDK's own floor: Python + importing ``mcp``);
- ``training-assets``: ``training-assets mcp`` (all 21 tools, resources, prompts).

The target is ``tools/list`` within 2 s of launch; the ratio to ``bare`` says how much of it is
ours. With ``--execute`` (default) each round then times, on the training-assets server, its
first tool call (``list_assets``: the call that imports dagster and loads the Definitions, unless
the background warm-up got there first) and then an executed tool call (``train_tokenizer`` with
``options.execute`` on a fresh Dagster home and data root holding the sample batches: it plans,
registers the batches, validates and creates the runs) to the moment its ``run_id`` is back; the
runs are then canceled before they start (only the latency is measured). The target there is
5 s. The last line is ``RESULT {json}``.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

import anyio

ROOT = Path(__file__).resolve().parents[1]
BIN = Path(sys.executable).parent
BARE = "from mcp.server import MCPServer\ns = MCPServer('bare')\n@s.tool()\ndef ping() -> str:\n    return 'pong'\ns.run()\n"


def _env(home: Path, root: Path) -> dict[str, str]:
    keep = ("HOME", "PATH", "LANG")
    return {**{k: os.environ[k] for k in keep if k in os.environ}, "DAGSTER_HOME": str(home),
            "TRAINING_ASSETS_DATA": str(root), "HF_HUB_OFFLINE": "1"}


async def _time_server(command: list[str], env: dict[str, str], execute: bool
                       ) -> tuple[float, float | None, float | None]:
    from mcp import Client, StdioServerParameters

    params = StdioServerParameters(command=command[0], args=command[1:], env=env, cwd=str(ROOT))
    started = time.perf_counter()
    async with Client(params, read_timeout_seconds=120) as client:
        tools = (await client.list_tools()).tools
        listed = time.perf_counter() - started
        assert tools, "the server listed no tools"
        if not execute:
            return listed, None, None
        t0 = time.perf_counter()
        first = await client.call_tool("list_assets", {"keys": ["tokenizer"]})
        first_s = time.perf_counter() - t0
        assert not first.is_error, first.content
        t0 = time.perf_counter()
        result = await client.call_tool("train_tokenizer", {"options": {"execute": True}})
        launched = time.perf_counter() - t0
        assert not result.is_error and result.structured_content["run_id"], result.content
        for run_id in result.structured_content["run_ids"]:
            await client.call_tool("cancel_run", {"run_id": run_id})
        return listed, first_s, launched


def _spread(values: list[float]) -> dict[str, float] | None:
    if not values:
        return None
    return {"median": round(statistics.median(values), 3), "min": round(min(values), 3), "max": round(max(values), 3)}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--no-execute", action="store_true", help="only time tools/list")
    args = parser.parse_args()
    from training_assets import sample_traces

    tmp = Path(tempfile.mkdtemp(prefix="mcp_startup_"))
    bare_file = tmp / "bare_server.py"
    bare_file.write_text(BARE)
    sides = {"bare": [sys.executable, str(bare_file)], "training-assets": [str(BIN / "training-assets"), "mcp"]}
    times: dict[str, list[float]] = {s: [] for s in sides}
    firsts: list[float] = []
    launches: list[float] = []
    load_before = os.getloadavg()[0]
    try:
        for i in range(args.rounds):
            order = list(sides) if i % 2 == 0 else list(reversed(sides))
            for side in order:
                home, root = tmp / f"home{i}{side}", tmp / f"data{i}{side}"
                home.mkdir()
                shutil.copyfile(ROOT / "dagster_home" / "dagster.yaml", home / "dagster.yaml")
                sample_traces.write_samples(root)
                execute = side == "training-assets" and not args.no_execute
                listed, first_s, launched = anyio.run(_time_server, sides[side], _env(home, root), execute)
                times[side].append(listed)
                if launched is not None:
                    firsts.append(first_s)
                    launches.append(launched)
                print(f"round {i} {side:<16} tools/list {listed:.2f} s" + (
                    f"  first call {first_s:.2f} s  execute -> run_id {launched:.2f} s" if launched is not None else ""),
                    flush=True)
            time.sleep(3)  # let the launched run's worker finish its import before the next round
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    ratios = [a / b for a, b in zip(times["training-assets"], times["bare"])]
    result = {
        "rounds": args.rounds,
        "tools_list_s": {s: _spread(v) for s, v in times.items()},
        "ratio_to_bare": _spread(ratios),
        "tools_list_within_2s": statistics.median(times["training-assets"]) <= 2.0,
        "first_call_s": _spread(firsts),
        "execute_to_run_id_s": {**_spread(launches), "within_5s": statistics.median(launches) <= 5.0} if launches else None,
        "load_avg": {"before": round(load_before, 2), "after": round(os.getloadavg()[0], 2)},
    }
    print("RESULT " + json.dumps(result, sort_keys=True))
    return 0


if __name__ == "__main__":
    sys.exit(main())
