"""Latency from a trace batch landing in the inbox to the new registry version, and where it went.

    .venv/bin/python benchmarks/trace_to_registry.py --url http://127.0.0.1:3000 --data "$TRAINING_ASSETS_DATA"

Against a running instance (webserver + daemon, automation sensor running, the demo's defaults,
at least one registry version already there so the tokenizer and base are in place): drops one
new sample batch (a fresh seed, so new traces) into ``<data>/inbox``, waits for the next
``registry_entry`` materialisation, then reads the runs the drop caused back from the webserver's
GraphQL API and splits the wall time into: sensor (file landed → raw_traces run created), each
run's queue wait (created → started) and start-up (started → first step), every step's duration,
and the gaps between runs (automation ticks). A latency breakdown, not a comparison: there is
no second side to alternate with, so the rounds-and-ratio rule of benchmarks/ does not apply;
``--rounds N`` drops N batches one after another and reports the median and spread.
Last line: ``RESULT {json}``.
"""

from __future__ import annotations

import argparse
import gzip
import json
import os
import statistics
import time
from pathlib import Path

import requests

from training_assets.sample_traces import make_batches

RUNS = """query($after: Float) { runsOrError(filter: {createdAfter: $after}, limit: 200) { __typename
  ... on Runs { results { runId status creationTime startTime endTime tags { key value }
  stepStats { stepKey startTime endTime status } } } } }"""
VERSIONS = """{ assetOrError(assetKey: {path: ["registry_entry"]}) { __typename ... on Asset {
  assetMaterializations(limit: 1000) { timestamp metadataEntries { label ... on IntMetadataEntry { intValue } } } } } }"""


def graphql(url: str, query: str, **variables) -> dict:
    response = requests.post(f"{url}/graphql", json={"query": query, "variables": variables}, timeout=60)
    response.raise_for_status()
    body = response.json()
    if body.get("errors"):
        raise RuntimeError(f"GraphQL errors from {url}: {body['errors']}")
    return body["data"]


def registry_count(url: str) -> int:
    node = graphql(url, VERSIONS)["assetOrError"]
    return len(node["assetMaterializations"]) if node["__typename"] == "Asset" else 0


def drop_batch(inbox: Path, seed: int) -> tuple[Path, float]:
    """A new sample batch (its own seed) renamed into the inbox; returns the path and the landing time."""
    batches, _ = make_batches(seed=seed)
    name = f"bench-{seed}-{int(time.time())}.jsonl.gz"
    tmp = inbox / f".{name}.tmp"
    tmp.write_bytes(gzip.compress(b"\n".join(batches[0]) + b"\n", mtime=0))
    landed = time.time()
    os.replace(tmp, inbox / name)
    return inbox / name, landed


def breakdown(url: str, landed: float) -> dict:
    runs = graphql(url, RUNS, after=landed - 1)["runsOrError"]["results"]
    runs = sorted(runs, key=lambda r: r["creationTime"])
    out: dict = {"runs": [], "sensor_s": None}
    for run in runs:
        tags = {t["key"]: t["value"] for t in run["tags"]}
        steps = {s["stepKey"]: round((s["endTime"] or 0) - (s["startTime"] or 0), 2) for s in run["stepStats"]
                 if s["startTime"]}
        first_step = min((s["startTime"] for s in run["stepStats"] if s["startTime"]), default=run["startTime"])
        out["runs"].append({
            "run_id": run["runId"], "status": run["status"], "sensor": tags.get("dagster/sensor_name"),
            "created_after_landing_s": round(run["creationTime"] - landed, 2),
            "queue_s": round((run["startTime"] or run["creationTime"]) - run["creationTime"], 2),
            "startup_s": round((first_step or 0) - (run["startTime"] or 0), 2) if run["startTime"] else None,
            "wall_s": round((run["endTime"] or 0) - run["creationTime"], 2) if run["endTime"] else None,
            "steps_s": steps})
    if out["runs"]:
        out["sensor_s"] = out["runs"][0]["created_after_landing_s"]
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--url", required=True, help="the Dagster webserver, e.g. http://127.0.0.1:3000")
    parser.add_argument("--data", required=True, help="the instance's data root (its inbox is <data>/inbox)")
    parser.add_argument("--rounds", type=int, default=1, help="batches to drop one after another")
    parser.add_argument("--timeout-s", type=float, default=1800)
    args = parser.parse_args()
    inbox = Path(args.data) / "inbox"
    if not inbox.is_dir():
        raise SystemExit(f"{inbox} does not exist: pass the running instance's data root as --data")
    rounds = []
    for i in range(args.rounds):
        before = registry_count(args.url)
        _, landed = drop_batch(inbox, seed=1000 + i)
        deadline = time.monotonic() + args.timeout_s
        while registry_count(args.url) <= before:
            if time.monotonic() > deadline:
                raise SystemExit(f"no new registry version {args.timeout_s:.0f} s after the batch landed; "
                                 "is the automation sensor running (TRAINING_ASSETS_AUTOMATION)?")
            time.sleep(1)
        total = time.time() - landed
        detail = breakdown(args.url, landed)
        rounds.append({"landing_to_registry_s": round(total, 1), **detail})
        print(json.dumps(rounds[-1], indent=2))
    totals = [r["landing_to_registry_s"] for r in rounds]
    result = {"rounds": len(rounds), "median_s": statistics.median(totals),
              "min_s": min(totals), "max_s": max(totals), "load_avg": os.getloadavg()[0]}
    print("RESULT " + json.dumps(result))


if __name__ == "__main__":
    main()
