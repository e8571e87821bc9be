"""The trace inbox: what a sensor tick sees, and how a run stages a batch.

Pure library (no Dagster); the sensor and the ``raw_traces`` asset are thin wrappers around it.

- ``scan_inbox`` (the sensor tick) only lists the inbox and ``lstat``s each entry: it never opens
  a batch, so a multi-GB file costs the tick what a small one does. A batch's partition key is
  ``<stem>-<fingerprint(name, size, mtime)>`` (``traces.batch_id_for``). Unsafe names,
  symlinks and anything that is not a regular file are refused: moved to ``inbox/_rejected/``
  beside a ``.reason`` file (never deleted, never followed or opened). ``_rejected`` must be a
  real folder of the inbox: it is opened without following links and the move and the note go
  through that open folder, so a link planted there cannot send a refused file out of the data
  root; when it is not, refused entries stay in the inbox and the scan says why.
- ``stage_batch`` (inside the ``raw_traces`` run) hashes the inbox file while copying it to the
  immutable snapshot ``batches/<batch_id><suffix>`` and records ``batches/<batch_id>.json``
  (source name, size, mtime, sha256). A file whose content was already staged under another
  batch id (the same file dropped again) is recorded as ``duplicate_of`` that batch: its
  partition holds no traces, so nothing downstream changes. The content claim
  ``batches/by_sha256/<sha256>`` appears whole (hard-linked from a complete temporary file) and
  only after the claimant's snapshot is in place, so two copies staged at the same moment
  always give one original and one duplicate. A re-run of a staged batch reuses the snapshot,
  even after the inbox file is gone.
"""

from __future__ import annotations

import contextlib
import errno
import hashlib
import json
import os
import stat
import tempfile
from collections.abc import Iterable, Iterator, Mapping
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
    reject_error: str | None = None  # why refused entries were left in the inbox (a bad reject folder)


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


@contextlib.contextmanager
def _open_dir(path: Path) -> Iterator[int]:
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        yield fd
    finally:
        os.close(fd)


@contextlib.contextmanager
def _open_rejected(inbox_fd: int, root: str | os.PathLike[str] | None) -> Iterator[int]:
    """``inbox/_rejected`` (made when absent) opened without following links, else a BatchError."""
    with contextlib.suppress(FileExistsError):
        os.mkdir(REJECTED, 0o755, dir_fd=inbox_fd)
    try:
        fd = os.open(REJECTED, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW, dir_fd=inbox_fd)
    except OSError as exc:  # O_NOFOLLOW | O_DIRECTORY: a symbolic link or a file there fails (ENOTDIR)
        rejected = paths.rejected_dir(root)
        kind = "a symbolic link" if os.path.islink(rejected) else f"not a folder ({exc.strerror})"
        raise BatchError(f"{rejected} is {kind}; refused inbox entries are only moved into a real folder of the "
                         "data root: remove it (the sensor makes the folder again); refused entries stay in the "
                         "inbox until then") from exc
    try:
        yield fd
    finally:
        os.close(fd)


def _lexists(name: str, dir_fd: int) -> bool:
    try:
        os.stat(name, dir_fd=dir_fd, follow_symlinks=False)
    except FileNotFoundError:
        return False
    return True


def reject_file(name: str, reason: str, root: str | os.PathLike[str] | None = None) -> Path:
    """Move the refused inbox entry ``name`` aside (never delete it, never follow it) with a note saying why.

    Everything goes through open folder descriptors (``rename`` with ``src_dir_fd``/``dst_dir_fd``,
    the note created ``O_EXCL | O_NOFOLLOW``): no path is resolved again after the checks.
    """
    with _open_dir(paths.inbox_dir(root)) as inbox_fd, _open_rejected(inbox_fd, root) as rejected_fd:
        target, n = name, 1
        while _lexists(target, rejected_fd) or _lexists(f"{target}.reason", rejected_fd):
            target, n = f"{name}.{n}", n + 1
        # same filesystem; a symlink moves as a link, a FIFO is never opened
        os.rename(name, target, src_dir_fd=inbox_fd, dst_dir_fd=rejected_fd)
        note = os.open(f"{target}.reason", os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o644,
                       dir_fd=rejected_fd)
        with os.fdopen(note, "w", encoding="utf-8") as handle:
            handle.write(reason + "\n")
    return paths.rejected_dir(root) / target


def scan_inbox(seen: Mapping[str, str] | None = None, known_batch_ids: Iterable[str] = (),
               root: str | os.PathLike[str] | None = None, reject: bool = True) -> InboxScan:
    """List the inbox and name each batch file's partition; read nothing.

    ``seen`` (the sensor cursor) maps a file name to the batch id already requested for it; a
    file whose key is in ``seen`` or in ``known_batch_ids`` (e.g. the materialised partitions) is known.
    ``reject=False`` only reports refused entries instead of moving them aside (a read-only preview);
    so does a reject folder that is not a real folder (``scan.reject_error`` says why).
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
            if reject and scan.reject_error is None:
                try:
                    reject_file(entry.name, f"refused {entry.name!r}: {reason}", root)
                except BatchError as exc:  # a bad reject folder: leave every refused entry where it is
                    scan.reject_error = str(exc)
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
    """The batch id that owns ``sha256``: ``batch_id`` if it is the first to stage these bytes.

    The claim is written whole under a temporary name, then hard-linked to ``by_sha256/<sha256>``:
    the link fails when the name exists, so exactly one run wins, and a loser always reads the
    winner's id (never an empty file that is still being written).
    """
    claims = paths.batches_dir(root) / BY_HASH_DIR
    claims.mkdir(parents=True, exist_ok=True)
    claim = claims / sha256
    fd, tmp = tempfile.mkstemp(prefix=f".{sha256}.", suffix=".tmp", dir=claims)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as handle:
            handle.write(batch_id + "\n")
            handle.flush()
            os.fsync(handle.fileno())
        os.chmod(tmp, 0o644)
        os.link(tmp, claim)
    except FileExistsError:
        owner = claim.read_text(encoding="utf-8").strip()
        try:
            return check_batch_id(owner)
        except BatchError as exc:
            raise BatchError(f"batch {batch_id}: content claim {claim} holds {owner!r}, not a batch id; remove that "
                             "file and re-run (the next run staging these bytes claims them)") from exc
    finally:
        os.unlink(tmp)
    return batch_id


def _snapshot_of(batch_id: str, root: str | os.PathLike[str] | None) -> Path | None:
    """The staged copy of ``batch_id``, or None.

    A claim's owner made its copy before claiming, so the copy is there however far the owner's
    run has got (unless removed by hand).
    """
    for suffix in BATCH_SUFFIXES:
        path = paths.batches_dir(root) / f"{batch_id}{suffix}"
        if path.is_file():
            return path
    return None


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
    size, mtime_ns, sha256 = _copy_hashing(source, target, batch_id)  # the snapshot exists before the claim
    owner = _claim_content(sha256, batch_id, root)
    staged = StagedBatch(batch_id, source.name, target, size, mtime_ns, sha256)
    # The owner's snapshot, not its staging record: the record is written after the claim, so a
    # run staging the same bytes at the same moment may not see it yet.
    original = _snapshot_of(owner, root) if owner != batch_id else None
    if original is not None:
        target.unlink()  # the bytes are already kept under the first batch
        staged = StagedBatch(batch_id, source.name, original, size, mtime_ns, sha256, duplicate_of=owner)
    write_json_atomic(_record_path(batch_id, root), staged.to_json())
    return staged
