"""Same inputs and config give byte-identical adapters and the same data version, in any process.

Each training runs in a fresh process with its own ``PYTHONHASHSEED`` (as each Dagster run worker,
and a Pipes subprocess, has its own), so nothing may depend on the per-process string-hash salt, on
RNG state left by earlier code (two jobs in one process, in the other order: as a run's process
trains sft, dpo and grpo one after another), or on whether the run was trained now or found
finished (re-materialised in this process).
"""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from training_assets.checkpoint_manifest import checkpoint_data_version
from training_assets.trainers import jobs

HERE = Path(__file__).parent
LORA = {"r": 4, "alpha": 8}
ADAPTERS = {
    "dpo_checkpoint": {"max_steps": 2, "batch_size": 4, "lora": LORA, "torch_threads": 1, "save_steps": 1},
    "grpo_checkpoint": {"max_steps": 2, "batch_size": 2, "lora": LORA, "torch_threads": 1, "save_steps": 1,
                        "grpo": {"rollout": "mixed", "num_generations": 2, "max_new_tokens": 4}},
}
# Two string-hash salts under which PEFT's set of LoRA target modules iterates in different orders.
FIRST_SALT, SECOND_SALT = "1", "2"


def _run_in_fresh_process(job_paths, salt):
    env = {**os.environ, "PYTHONHASHSEED": salt, "OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1"}
    done = subprocess.run([sys.executable, str(HERE / "_run_jobs.py"), *map(str, job_paths)], env=env,
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]


def fresh_process(salt):
    """A ``run_training`` launcher: the job in a new process with its own hash salt (as a Pipes subprocess)."""

    def launch(argv):
        result = Path(argv[-1]).parent / "result.json"
        result.unlink(missing_ok=True)  # a re-materialised run rewrites it
        _run_in_fresh_process([argv[-1]], salt)
        return json.loads(result.read_text())

    return launch


def _files(folder):
    return {p.relative_to(folder).as_posix(): p.read_bytes() for p in sorted(Path(folder).rglob("*")) if p.is_file()}


@pytest.fixture(scope="module")
def two_processes(tmp_path_factory, write_upstream):
    """dpo/grpo trained fresh in their own processes; then, in one other process with another hash salt,
    trained fresh again in separate output dirs (in the opposite order); and re-materialised on the same
    data root in this process (a finished run, found and resumed)."""
    root = write_upstream(tmp_path_factory.mktemp("data"))
    for asset, overrides in (("base_checkpoint", {"max_steps": 1, "batch_size": 4}),
                             ("sft_checkpoint", {"max_steps": 1, "batch_size": 2, "packing": True})):
        jobs.run_training(jobs.prepare_job(asset, root, {**overrides, "torch_threads": 1}))

    first = {a: jobs.run_training(jobs.prepare_job(a, root, o), launcher=fresh_process(FIRST_SALT))
             for a, o in ADAPTERS.items()}
    first_manifests = {a: run.manifest for a, run in first.items()}
    first_merged = jobs.merge_job(root)
    first_files = {a: _files(m.checkpoint_dir) for a, m in first_manifests.items()}

    elsewhere = {}
    for asset, run in first.items():
        spec = json.loads((run.job.run_dir / "job.json").read_text())
        out = tmp_path_factory.mktemp(f"elsewhere-{asset}")
        spec["config"]["output_dir"], spec["result_path"] = str(out), str(out / "result.json")
        (out / "job.json").write_text(json.dumps(spec))
        elsewhere[asset] = (out, run.job.data_versions)
    # the other order too: no job may start from RNG state that an earlier job in the process left behind
    _run_in_fresh_process([out / "job.json" for out, _ in reversed(elsewhere.values())], SECOND_SALT)
    results = {a: (json.loads((out / "result.json").read_text()), versions) for a, (out, versions) in elsewhere.items()}
    again = {a: jobs.run_training(jobs.prepare_job(a, root, o)).manifest for a, o in ADAPTERS.items()}
    return {"first": first_manifests, "first_files": first_files, "first_merged": first_merged, "elsewhere": results,
            "again": again, "again_merged": jobs.merge_job(root)}


@pytest.mark.parametrize("asset", sorted(ADAPTERS))
def test_fresh_runs_in_two_processes_give_identical_adapters(two_processes, asset):
    first = two_processes["first"][asset]
    result, versions = two_processes["elsewhere"][asset]
    assert result["resumed_from"] is None and first.train.resumed_from is None  # both trained
    assert result["checkpoint_dir"] != first.checkpoint_dir
    assert result["losses"] == first.train.losses
    assert result.get("mean_rewards", []) == first.train.mean_rewards  # GRPO: the same rollouts were sampled
    files = _files(result["checkpoint_dir"])
    assert sorted(files) == sorted(two_processes["first_files"][asset])
    for name, data in files.items():
        assert data == two_processes["first_files"][asset][name], f"{asset}: {name} differs between the two runs"
    assert checkpoint_data_version(result["checkpoint_dir"], versions) == first.data_version


def test_rematerialising_a_finished_run_keeps_every_data_version(two_processes):
    for asset, first in two_processes["first"].items():
        again = two_processes["again"][asset]
        assert again.checkpoint_dir == first.checkpoint_dir
        assert again.train.resumed_from and again.train.losses == first.train.losses
        assert again.data_version == first.data_version, asset
    # and so the merge does not register a new version either
    assert two_processes["again_merged"].data_version == two_processes["first_merged"].data_version
