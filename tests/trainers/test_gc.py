"""``training-assets gc``: run folders are freed only when no manifest, registry version or queued/running
run refers to them, and only with ``--execute``; training itself never deletes one."""

import json
import os
import time
from pathlib import Path

import dagster as dg
import pytest

from training_assets import cli
from training_assets.commands import gc

OLD = time.time() - 7200


def _run(root: Path, asset: str, name: str, mtime: float = OLD) -> Path:
    folder = root / asset / "runs" / name
    (folder / "final").mkdir(parents=True)
    (folder / "final" / "model.safetensors").write_bytes(b"\0" * 4096)
    for p in (folder / "final" / "model.safetensors", folder / "final", folder):
        os.utime(p, (mtime, mtime))
    return folder


def _manifest(path: Path, **fields) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps({"asset": "x", "kind": "full", "tokenizer_dir": "/nowhere", "data_version": "v", **fields}))


@pytest.fixture()
def root(tmp_path) -> Path:
    root = tmp_path / "data"
    live = _run(root, "base_checkpoint", "live")
    _run(root, "base_checkpoint", "stale")
    sft = _run(root, "sft_checkpoint", "used-as-base")
    _run(root, "sft_checkpoint", "fresh", mtime=time.time())
    _manifest(root / "base_checkpoint" / "manifest.json", checkpoint_dir=str(live / "final"))
    # an adapter's base lives in an SFT run folder: that folder stays while the adapter's manifest names it
    _manifest(root / "dpo_checkpoint" / "manifest.json", kind="adapter", checkpoint_dir=str(root / "dpo_checkpoint" / "a"),
              base_model_dir=str(sft / "final"))
    _run(root, "dpo_checkpoint", "registered")
    _run(root, "grpo_checkpoint", "training-now")
    return root


def _cli(capsys, *argv) -> dict:
    assert cli.main(["gc", *argv, "--json"]) == 0
    return json.loads(capsys.readouterr().out)


def test_plan_keeps_every_referenced_folder_and_says_why(root):
    registry = [("registry version 3", [str(root / "dpo_checkpoint" / "runs" / "registered" / "final")])]
    active = [{"run_id": "r1", "status": "STARTED", "assets": ["grpo_checkpoint"]}]
    plan = gc.plan_gc(root, gc.manifest_references(root), registry, active, min_age_s=600)
    assert [p.name for p, _ in plan.free] == ["stale"] and plan.bytes_to_free == 4096
    reasons = {p.name: r for p, r in plan.keep}
    assert reasons["live"].startswith("referenced by") and "base_checkpoint/manifest.json" in reasons["live"]
    assert "dpo_checkpoint/manifest.json" in reasons["used-as-base"]
    assert reasons["registered"] == "referenced by registry version 3"
    assert reasons["training-now"] == "Dagster run r1 (STARTED) may be training grpo_checkpoint"
    assert "--min-age-s" in reasons["fresh"]


def test_dry_run_by_default_then_execute_frees_only_the_unreferenced(root, tmp_path, capsys, monkeypatch):
    home = tmp_path / "home"
    home.mkdir()
    monkeypatch.setenv("DAGSTER_HOME", str(home))
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    with dg.DagsterInstance.get() as instance:  # a run training grpo_checkpoint right now
        instance.add_run(dg.DagsterRun(job_name="__ASSET_JOB", run_id="a" * 36, status=dg.DagsterRunStatus.STARTED,
                                       asset_selection=frozenset({dg.AssetKey("grpo_checkpoint")})))
    before = sorted(p.relative_to(root) for p in root.rglob("runs/*"))
    dry = _cli(capsys, "--root", str(root))
    assert not dry["executed"] and [Path(f["path"]).name for f in dry["free"]] == ["stale", "registered"]
    assert sorted(p.relative_to(root) for p in root.rglob("runs/*")) == before  # nothing deleted
    keep = {Path(k["path"]).name: k["reason"] for k in dry["keep"]}
    assert keep["training-now"].startswith(f"Dagster run {'a' * 36} (STARTED)")

    done = _cli(capsys, "--root", str(root), "--execute")
    assert done["executed"] and done["bytes_to_free"] == 2 * 4096
    left = {p.name for p in root.rglob("runs/*")}
    assert left == {"live", "used-as-base", "fresh", "training-now"}


def test_gc_refuses_without_a_dagster_instance(root, capsys, monkeypatch):
    monkeypatch.delenv("DAGSTER_HOME", raising=False)
    assert cli.main(["gc", "--root", str(root), "--execute"]) == 2
    assert "DAGSTER_HOME is not set" in capsys.readouterr().err
    assert (root / "base_checkpoint" / "runs" / "stale").is_dir()


def test_an_unreadable_manifest_stops_gc(root, capsys):
    (root / "sft_checkpoint" / "manifest.json").write_text("{not json")
    assert cli.main(["gc", "--root", str(root), "--no-dagster", "--execute"]) == 2
    assert "sft_checkpoint/manifest.json is not readable JSON" in capsys.readouterr().err
    assert (root / "base_checkpoint" / "runs" / "stale").is_dir()


def test_a_folder_a_training_run_holds_is_kept_even_when_old_and_unreferenced(root):
    """A CLI run (no Dagster run to ask about) holds its folder's .run.lock: gc must not free it mid-training."""
    from training_assets.trainers.run_guards import hold_run_dir

    stale = root / "base_checkpoint" / "runs" / "stale"
    with hold_run_dir(stale):
        os.utime(stale, (OLD, OLD))
        plan = gc.plan_gc(root, gc.manifest_references(root), [], [], min_age_s=600)
        assert dict(plan.keep)[stale] == f"a training run (pid {os.getpid()}) holds it"
        assert stale not in dict(plan.free)
    for p in (stale / ".run.lock", stale):  # the lock file stays; age it like the rest of the folder
        os.utime(p, (OLD, OLD))
    plan = gc.plan_gc(root, gc.manifest_references(root), [], [], min_age_s=600)
    assert stale in dict(plan.free)
