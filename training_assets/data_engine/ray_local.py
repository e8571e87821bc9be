"""A multi-node Ray cluster on loopback only, for tests, benchmarks and trying ``engine="ray"`` on one machine.

``ray.init()`` / ``ray start`` bind the machine's own network address on Linux, even when asked
for 127.0.0.1; with ``RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER=0`` and ``ray.cluster_utils.Cluster``
every node (head included) stays on 127.0.0.1 (checked here: ``loopback_nodes``).

Start-up on a loaded machine: the raylet gives its agents (Python processes) about 15 s to
start, and a Python that may not write bytecode (``PYTHONDONTWRITEBYTECODE``) recompiles Ray on
every start. The cluster's processes therefore write bytecode under ``PYCACHE`` (a prefix outside
every venv) and one throwaway import fills it before the first node starts.

    with local_cluster(nodes=2) as cluster:
        ray.init(address=cluster.address)
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

# Before anything imports ray: it reads this once, at import (see the module docstring).
os.environ.setdefault("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER", "0")

# `make test` already sets a prefix (.venv/pycache): the cluster shares it
PYCACHE = Path(os.environ.get("TRAINING_ASSETS_RAY_PYCACHE") or os.environ.get("PYTHONPYCACHEPREFIX")
               or Path.home() / ".cache" / "training_assets" / "ray-pycache")
OBJECT_STORE_BYTES = 300 << 20
AGENT_MODULES = "import ray.dashboard.agent, ray._private.runtime_env.agent.main, ray._private.workers.default_worker"


def _free_ports(n: int) -> list[int]:
    socks = [socket.socket() for _ in range(n)]
    try:
        for s in socks:
            s.bind(("127.0.0.1", 0))
        return [s.getsockname()[1] for s in socks]
    finally:
        for s in socks:
            s.close()


def node_args(num_cpus: int) -> dict[str, Any]:
    """Arguments of one loopback node: CPUs, a small object store, no dashboard, agent ports on 127.0.0.1."""
    ports = dict(zip(("metrics_agent_port", "metrics_export_port", "dashboard_agent_listen_port",
                      "runtime_env_agent_port"), _free_ports(4), strict=True))
    return {"num_cpus": num_cpus, "object_store_memory": OBJECT_STORE_BYTES, "include_dashboard": False, **ports}


def loopback_nodes(ray: Any) -> list[str]:
    """Addresses of the live nodes; raises if any is not 127.0.0.1."""
    addresses = [n["NodeManagerAddress"] for n in ray.nodes() if n.get("Alive")]
    off = [a for a in addresses if a != "127.0.0.1"]
    if off:
        raise RuntimeError(f"Ray nodes bound {off}, not loopback; set RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER=0 "
                           "before ray is imported")
    return addresses


@contextmanager
def local_cluster(nodes: int = 2, cpus_per_node: int = 1) -> Iterator[Any]:
    """A ``ray.cluster_utils.Cluster`` of ``nodes`` loopback nodes (the head is one), shut down after.

    The bytecode settings hold while the cluster runs (its processes inherit them) and are restored after.
    """
    from ray._private import ray_constants  # deferred: ray is optional and heavy (the scale extra)

    if ray_constants.ENABLE_RAY_CLUSTER:  # read once, when ray is imported: nodes would bind the machine's address
        raise RuntimeError("ray was imported before RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER=0 was set; set it in the "
                           "environment (or import training_assets.data_engine.ray_local first)")
    saved = {k: os.environ.get(k) for k in ("PYTHONPYCACHEPREFIX", "PYTHONDONTWRITEBYTECODE")}
    os.environ["PYTHONPYCACHEPREFIX"] = str(PYCACHE)
    os.environ.pop("PYTHONDONTWRITEBYTECODE", None)
    PYCACHE.mkdir(parents=True, exist_ok=True)
    subprocess.run([sys.executable, "-c", AGENT_MODULES], check=True, env=os.environ.copy())
    from ray.cluster_utils import Cluster  # deferred with ray_constants above

    cluster = Cluster(initialize_head=True, head_node_args=node_args(cpus_per_node))
    try:
        for _ in range(nodes - 1):
            cluster.add_node(**node_args(cpus_per_node))
        cluster.wait_for_nodes()
        yield cluster
    finally:
        cluster.shutdown()
        for key, value in saved.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value
