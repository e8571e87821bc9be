"""Counted slots across processes: ``hold_slot(directory, name, limit)`` holds one of ``limit`` slots.

    with hold_slot(root / ".slots", "training", limit=1, on_wait=log.info):
        train()                                   # at most `limit` holders at once, whichever process

Each slot is a file ``<directory>/<name>.<i>.lock`` held with an exclusive ``flock``: the kernel
releases it when the holder exits or dies (SIGKILL, OOM), so a crashed holder never leaves a slot
taken. The files live on the data root, which every process of a deployment shares (one host; on
several hosts a shared volume whose locks the hosts honour, e.g. NFSv4).

Why the training assets need it beside Dagster's ``training`` pool: Dagster 1.13 claims a pool slot
with a ``SELECT … FOR UPDATE SKIP LOCKED`` and then an ``UPDATE`` in two statements on an autocommit
connection (and SQLite ignores the row lock), so two steps claiming within milliseconds can both
take the one slot (seen in tests/trainers/test_pools.py on PostgreSQL and on SQLite; the same
statement-level autocommit is discussed in dagster-io/dagster#34092). The pool still queues the
steps and shows them in the UI; this lock is what makes the limit hold. It is the one scheduling
device kept beside Dagster's, for that race only: drop it once Dagster claims a pool slot in one
atomic statement.

It lives in the library, not in ``training_assets.orchestration``: a training step takes it inside
its own execution, and it knows nothing of a Dagster instance (no dagster import).
"""

from __future__ import annotations

import fcntl
import os
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path


@contextmanager
def hold_slot(directory: str | os.PathLike[str], name: str, limit: int = 1, poll_s: float = 0.2,
              on_wait: Callable[[str], None] | None = None) -> Iterator[int]:
    """Hold one of ``limit`` slots called ``name`` in ``directory`` while the block runs; yields its index.

    Waits (polling every ``poll_s``) while all slots are held; ``on_wait`` gets one line when it
    starts waiting and one when it got a slot.
    """
    if limit < 1:
        raise ValueError(f"slot {name!r}: limit must be >= 1, got {limit}")
    folder = Path(directory)
    folder.mkdir(parents=True, exist_ok=True)
    handles = [open(folder / f"{name}.{i}.lock", "a+b") for i in range(limit)]  # noqa: SIM115 (closed below)
    held = None
    try:
        waited_since = None
        while held is None:
            for i, handle in enumerate(handles):
                try:
                    fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
                except BlockingIOError:
                    continue
                held = i
                break
            if held is None:
                if waited_since is None:
                    waited_since = time.monotonic()
                    if on_wait is not None:
                        on_wait(f"all {limit} {name!r} slot(s) under {folder} are held; waiting for one")
                time.sleep(poll_s)
        if waited_since is not None and on_wait is not None:
            on_wait(f"got {name!r} slot {held} after waiting {time.monotonic() - waited_since:.1f} s")
        yield held
    finally:
        for handle in handles:  # closing releases the lock
            handle.close()
