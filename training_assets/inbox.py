"""The trace inbox: what a sensor tick sees, and how a run stages a batch.

Pure library (no Dagster); the sensor and the ``raw_traces`` asset are thin wrappers around it.

- ``scan_inbox`` (the sensor tick) only lists the inbox and ``lstat``s each entry: it never opens
  a batch, so a multi-GB file costs the tick what a small one does. A batch's partition key is
  ``<stem>-<fingerprint(name, size, mtime)>`` (``traces.batch_id_for``). Unsafe names,
  symlinks and anything that is not a regular file are refused: moved to ``inbox/_rejected/``
  beside a ``.reason`` file (never deleted, never followed or opened).
- ``stage_batch`` (inside the ``raw_traces`` run) hashes the inbox file while copying it to the
  immutable snapshot ``batches/<batch_id><suffix>`` and records ``batches/<batch_id>.json``
  (source name, size, mtime, sha256). A file whose content was already staged under another
  batch id (the same file dropped again) is recorded as ``duplicate_of`` that batch: its
  partition holds no traces, so nothing downstream changes. A re-run of a staged batch reuses
  the snapshot, even after the inbox file is gone.
"""

from __future__ import annotations

import contextlib
import errno
import hashlib
import json
import os
import stat
from collections.abc import Iterable, Mapping
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from training_assets import paths
from training_assets.storage import HASH_CHUNK_BYTES, atomic_path, write_json_atomic
from training_assets.traces import BATCH_SUFFIXES, BatchError, batch_id_for, check_batch_id, unsafe_name_reason

REJECTED = "_rejected"
BY_HASH_DIR = "by_sha256"  # batches/by_sha256/<sha256>: the batch id that first staged that content


@dataclass(frozen=True)
class InboxBatch:
    """A batch file the tick saw: enough to name its partition, nothing read from it."""

    batch_id: str
    name: str
    size: int
    mtime_ns: int


@dataclass
class InboxScan:
    new: list[InboxBatch] = field(default_factory=list)
    known: list[str] = field(default_factory=list)
    rejected: list[tuple[str, str]] = field(default_factory=list)  # (file name, reason)
    seen: dict[str, str] = field(default_factory=dict)  # file name -> its batch id (the next cursor)


def suffix_of(name: str) -> str:
    return next(s for s in BATCH_SUFFIXES if name.endswith(s))


def _ignored(name: str) -> bool:
    # Writers drop files atomically (temp name + rename); hidden and temp files are not batches yet,
    # and `_rejected/` is where refused files go.
    return name.startswith((".", "_")) or name.endswith((".tmp", ".part"))


_KINDS = ((stat.S_ISDIR, "a directory"), (stat.S_ISFIFO, "a FIFO"), (stat.S_ISSOCK, "a socket"),
          (stat.S_ISBLK, "a block device"), (stat.S_ISCHR, "a character device"))


def refusal_reason(entry: os.DirEntry[str]) -> str | None:
    """Why an inbox entry is refused (symlink, not a regular file, unsafe name), or None."""
    if entry.is_symlink():
        return "a symbolic link (links are never followed: copy the batch into the inbox)"
    mode = entry.stat(follow_symlinks=False).st_mode
    if not stat.S_ISREG(mode):
        kind = next((name for test, name in _KINDS if test(mode)), "a special file")
        return f"{kind}, not a regular file"
    return unsafe_name_reason(entry.name)


def reject_file(path: Path, reason: str, root: str | os.PathLike[str] | None = None) -> Path:
    """Move a refused inbox entry aside (never delete it, never follow it) with a note saying why."""
    rejected = paths.rejected_dir(root)
    rejected.mkdir(parents=True, exist_ok=True)
    target = rejected / (path.name.replace("/", "_") or "unnamed")
    n = 1
    while os.path.lexists(target):
        target = rejected / f"{path.name}.{n}"
        n += 1
    os.rename(path, target)  # same filesystem; a symlink moves as a link, a FIFO is never opened
    (target.parent / f"{target.name}.reason").write_text(reason + "\n", encoding="utf-8")
    return target


def scan_inbox(seen: Mapping[str, str] | None = None, known_batch_ids: Iterable[str] = (),
               root: str | os.PathLike[str] | None = None, reject: bool = True) -> InboxScan:
    """List the inbox and name each batch file's partition; read nothing.

    ``seen`` (the sensor cursor) maps a file name to the batch id already requested for it; a
    file whose key is in ``seen`` or in ``known_batch_ids`` (e.g. the materialised partitions) is known.
    ``reject=False`` only reports refused entries instead of moving them aside (a read-only preview).
    """
    seen = dict(seen or {})
    known = set(known_batch_ids)
    scan = InboxScan()
    inbox = paths.inbox_dir(root)
    if not inbox.is_dir():
        return scan
    for entry in sorted(os.scandir(inbox), key=lambda e: e.name):
        if _ignored(entry.name):
            continue
        reason = refusal_reason(entry)
        if reason is not None:
            if reject:
                reject_file(Path(entry.path), f"refused {entry.name!r}: {reason}", root)
            scan.rejected.append((entry.name, reason))
            continue
        info = entry.stat(follow_symlinks=False)
        batch_id = batch_id_for(entry.name, info.st_size, info.st_mtime_ns)
        scan.seen[entry.name] = batch_id
        if seen.get(entry.name) == batch_id or batch_id in known:
            scan.known.append(batch_id)
        else:
            known.add(batch_id)
            scan.new.append(InboxBatch(batch_id, entry.name, info.st_size, info.st_mtime_ns))
    return scan


# --------------------------------------------------------------------------- staging (inside the run)


@dataclass(frozen=True)
class StagedBatch:
    batch_id: str
    source_name: str
    path: Path  # the immutable snapshot under batches/ (the first batch's, for a duplicate)
    size: int
    mtime_ns: int
    sha256: str
    duplicate_of: str | None = None  # the batch that first staged the same bytes

    def to_json(self) -> dict[str, Any]:
        return {**asdict(self), "path": self.path.name}


def _record_path(batch_id: str, root: str | os.PathLike[str] | None) -> Path:
    return paths.batches_dir(root) / f"{batch_id}.json"


def read_staged(batch_id: str, root: str | os.PathLike[str] | None = None) -> StagedBatch | None:
    """The staging record of a batch, or None when it was never staged."""
    record = _record_path(check_batch_id(batch_id), root)
    if not record.is_file():
        return None
    data = json.loads(record.read_text(encoding="utf-8"))
    return StagedBatch(**{**data, "path": paths.batches_dir(root) / data["path"]})


def find_inbox_file(batch_id: str, root: str | os.PathLike[str] | None = None) -> Path:
    """The inbox file whose (name, size, mtime) gives ``batch_id``, else a BatchError saying why."""
    inbox = paths.inbox_dir(root)
    stem = batch_id.rsplit("-", 1)[0]
    for suffix in BATCH_SUFFIXES:
        candidate = inbox / f"{stem}{suffix}"
        with contextlib.suppress(FileNotFoundError):
            info = candidate.lstat()
            if stat.S_ISREG(info.st_mode) and batch_id_for(candidate.name, info.st_size, info.st_mtime_ns) == batch_id:
                return candidate
    raise BatchError(f"batch {batch_id}: never staged, and no file in {inbox} has the name, size and mtime it was "
                     f"named from ({stem}.jsonl[.gz] was removed or replaced before its run); drop the file into "
                     "the inbox again: the sensor makes it a new batch")


def _copy_hashing(source: Path, target: Path, batch_id: str) -> tuple[int, int, str]:
    """Copy ``source`` to ``target`` atomically, hashing the bytes on the way; (size, mtime_ns, sha256).

    Opened without following links and without blocking (a FIFO swapped in is refused, not
    waited on); the file must keep the size and mtime its key was made from, before and after.
    """
    try:
        fd = os.open(source, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
    except OSError as exc:
        reason = "is a symbolic link" if exc.errno == errno.ELOOP else f"cannot be opened: {exc.strerror}"
        raise BatchError(f"batch {batch_id}: inbox file {source} {reason}") from exc
    digest = hashlib.sha256()
    with os.fdopen(fd, "rb") as handle:
        before = os.fstat(handle.fileno())
        if not stat.S_ISREG(before.st_mode):
            raise BatchError(f"batch {batch_id}: inbox file {source} is not a regular file")
        if batch_id_for(source.name, before.st_size, before.st_mtime_ns) != batch_id:
            raise BatchError(f"batch {batch_id}: {source} changed after the sensor saw it; its new content is "
                             "another batch")
        copied = 0
        with atomic_path(target) as tmp, open(tmp, "wb") as out:
            for chunk in iter(lambda: handle.read(HASH_CHUNK_BYTES), b""):
                digest.update(chunk)
                out.write(chunk)
                copied += len(chunk)
            out.flush()
            after = os.fstat(handle.fileno())
            if (after.st_size, after.st_mtime_ns, copied) != (before.st_size, before.st_mtime_ns, before.st_size):
                raise BatchError(f"batch {batch_id}: {source} was written to while being staged; write batches "
                                 "to a temporary name and rename them into the inbox")
    return before.st_size, before.st_mtime_ns, digest.hexdigest()


def _claim_content(sha256: str, batch_id: str, root: str | os.PathLike[str] | None) -> str:
    """The batch id that owns ``sha256``: ``batch_id`` if it is the first to stage these bytes."""
    claims = paths.batches_dir(root) / BY_HASH_DIR
    claims.mkdir(parents=True, exist_ok=True)
    claim = claims / sha256
    try:
        fd = os.open(claim, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)  # atomic: exactly one run wins
    except FileExistsError:
        return claim.read_text(encoding="utf-8").strip() or batch_id
    with os.fdopen(fd, "w", encoding="utf-8") as handle:
        handle.write(batch_id + "\n")
        handle.flush()
        os.fsync(handle.fileno())
    return batch_id


def stage_batch(batch_id: str, root: str | os.PathLike[str] | None = None) -> StagedBatch:
    """Stage one batch (see the module docstring); idempotent: a staged batch is returned as recorded."""
    check_batch_id(batch_id)
    existing = read_staged(batch_id, root)
    if existing is not None:
        if not existing.path.is_file():
            raise BatchError(f"batch {batch_id}: its staged copy {existing.path} is missing; restore it or drop the "
                             "file into the inbox again")
        return existing
    source = find_inbox_file(batch_id, root)
    target = paths.batches_dir(root) / f"{batch_id}{suffix_of(source.name)}"
    size, mtime_ns, sha256 = _copy_hashing(source, target, batch_id)
    owner = _claim_content(sha256, batch_id, root)
    staged = StagedBatch(batch_id, source.name, target, size, mtime_ns, sha256)
    if owner != batch_id:
        original = read_staged(owner, root)
        if original is not None and original.path.is_file():
            target.unlink()  # the bytes are already kept under the first batch
            staged = StagedBatch(batch_id, source.name, original.path, size, mtime_ns, sha256, duplicate_of=owner)
    write_json_atomic(_record_path(batch_id, root), staged.to_json())
    return staged


def staged_batch_path(batch_id: str, root: str | os.PathLike[str] | None = None) -> Path:
    """The immutable snapshot of a staged batch."""
    staged = read_staged(batch_id, root)
    if staged is None:
        raise BatchError(f"batch {batch_id}: not staged under {paths.batches_dir(root)}; materialise "
                         f"raw_traces[{batch_id}] (its run stages the inbox file)")
    return staged.path

