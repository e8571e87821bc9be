"""Where things live under the data root.

The data root is ``$TRAINING_ASSETS_DATA`` (default ``./data``). Every stage owns one folder
under it, named after its asset key, so a stage never writes into another's folder:

    data/
      inbox/                       trace batches arrive here (watched by the sensor)
      inbox/_rejected/             entries the sensor refused (unsafe names, symlinks, non-regular
                                   files), each with a .reason file
      batches/<batch_id>.jsonl[.gz] immutable snapshot of each staged batch (staged by its run)
      batches/<batch_id>.json       its staging record: source name, size, mtime, sha256, duplicate_of
      batches/by_sha256/<sha256>    the batch id that first staged those bytes
      raw_traces/<batch_id>/        traces.parquet + quarantine.jsonl + partition.json per partition
      <asset_key>/...               everything downstream
      slots/<pool>.<i>.lock         the training pool's slots, held while a step trains (``slots``)

What a run config may reach (``confine_path``, ``confine_ray_address``): a file a run reads
because its config names it (held-out sets, extra corpus sources, eval cases) must resolve,
symlinks followed, under the data root or under a folder of ``$TRAINING_ASSETS_SOURCE_DIRS``
(os.pathsep-separated); a Ray cluster it connects to must be on loopback, on the host of
``$RAY_ADDRESS`` (the cluster the operator configured) or on a host of
``$TRAINING_ASSETS_RAY_HOSTS`` (comma-separated). Run config reaches the platform from MCP
clients and the launchpad, so it must not open ``/etc/passwd`` or ship the corpus to any host;
the allow-lists are the operator's, set in the environment, never in run config. Callers check
at the tool / plan level (before anything runs) and again where the file is opened.
"""

from __future__ import annotations

import ipaddress
import os
import urllib.parse
from pathlib import Path

DATA_ENV = "TRAINING_ASSETS_DATA"
SOURCE_DIRS_ENV = "TRAINING_ASSETS_SOURCE_DIRS"
RAY_HOSTS_ENV = "TRAINING_ASSETS_RAY_HOSTS"


def data_root(root: str | os.PathLike[str] | None = None) -> Path:
    """Resolve the data root: the explicit argument, else ``$TRAINING_ASSETS_DATA``, else ``./data``."""
    if root is not None:
        return Path(root).resolve()
    return Path(os.environ.get(DATA_ENV, "data")).resolve()


def inbox_dir(root: str | os.PathLike[str] | None = None) -> Path:
    return data_root(root) / "inbox"


def rejected_dir(root: str | os.PathLike[str] | None = None) -> Path:
    return inbox_dir(root) / "_rejected"


def batches_dir(root: str | os.PathLike[str] | None = None) -> Path:
    return data_root(root) / "batches"


def asset_dir(asset_key: str, root: str | os.PathLike[str] | None = None) -> Path:
    """The folder a stage owns: ``<data root>/<asset_key>``."""
    if not asset_key or "/" in asset_key or asset_key.startswith("."):
        raise ValueError(f"asset key {asset_key!r} is not a plain folder name")
    return data_root(root) / asset_key


def slots_dir(root: str | os.PathLike[str] | None = None) -> Path:
    return data_root(root) / "slots"


def source_dirs(root: str | os.PathLike[str] | None = None) -> list[Path]:
    """Folders a run config may read files from: the data root, then ``$TRAINING_ASSETS_SOURCE_DIRS``."""
    extra = [Path(d).resolve() for d in os.environ.get(SOURCE_DIRS_ENV, "").split(os.pathsep) if d.strip()]
    return [data_root(root), *extra]


def confine_path(path: str | os.PathLike[str], field: str, root: str | os.PathLike[str] | None = None) -> Path:
    """``path`` resolved (symlinks followed, so a link inside cannot point outside) when it lies under
    an allowed folder (``source_dirs``); else ``ValueError`` naming ``field`` and the fix."""
    resolved = Path(path).resolve()
    allowed = source_dirs(root)
    if any(resolved.is_relative_to(folder) for folder in allowed):
        return resolved
    shown = f"{path} (-> {resolved})" if str(resolved) != os.path.abspath(path) else str(path)
    raise ValueError(f"{field}: {shown} is outside the data root {allowed[0]} and the allowed source folders; "
                     f"put the file under the data root, or add its folder to ${SOURCE_DIRS_ENV} "
                     f"({os.pathsep!r}-separated)")


def is_loopback(host: str) -> bool:
    """``localhost`` or a loopback IP address; any other name may resolve to an outside address."""
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False  # any other name may resolve to an outside address


def ray_host(address: str) -> str:
    """The host of a Ray address (``host:6379``, ``ray://host:10001``, ``[::1]:6379``), lower-cased."""
    parsed = urllib.parse.urlsplit(address if "://" in address else f"ray://{address}")
    return (parsed.hostname or "").lower()


def allowed_ray_hosts() -> set[str]:
    """Hosts beyond loopback a run may connect to: ``$RAY_ADDRESS``'s and ``$TRAINING_ASSETS_RAY_HOSTS``."""
    hosts = {h.strip().lower() for h in os.environ.get(RAY_HOSTS_ENV, "").split(",") if h.strip()}
    configured = os.environ.get("RAY_ADDRESS", "").strip()
    if configured and configured not in ("auto", "local"):
        hosts.add(ray_host(configured))
    return hosts


def confine_ray_address(address: str, field: str) -> str:
    """``address`` when its host is loopback or allowed (``allowed_ray_hosts``); else ``ValueError``
    naming ``field`` and the fix. ``auto`` / ``local`` (a cluster on this machine) are allowed."""
    if address in ("auto", "local"):
        return address
    host = ray_host(address)
    if host and (is_loopback(host) or host in allowed_ray_hosts()):
        return address
    raise ValueError(f"{field}: Ray cluster {address!r} is not on loopback, on the $RAY_ADDRESS host or on a host of "
                     f"${RAY_HOSTS_ENV}; the operator adds its host to ${RAY_HOSTS_ENV} (comma-separated), "
                     "or leave it empty to use $RAY_ADDRESS")
