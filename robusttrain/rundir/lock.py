"""The run-directory lock: one robusttrain command (or API fit) per run directory at a time.

An OS-level lock (:mod:`filelock`, ``flock`` on ``.robusttrain.lock``) that the kernel drops when
its process dies, so a killed run never blocks the next one and a reused pid cannot fool it.
Beside it, ``.robusttrain.owner`` (JSON: pid, host, command, since) says who holds it; it is removed
on every orderly release, so finding one when the lock is free means the previous owner was killed
(:attr:`RunLock.interrupted`).

Within one process the lock is shared by the CLI command and the trainer it runs; a second trainer
(another object) asking while one holds it is refused like another process. It is released when the
last holder lets go.

>>> import tempfile
>>> d = tempfile.mkdtemp()
>>> first, second = object(), object()
>>> lock = hold(d, "fit"); lock.interrupted, hold(d, "fit", holder=first) is lock
(None, True)
>>> hold(d, "fit", holder=second)  # doctest: +ELLIPSIS
Traceback (most recent call last):
...
robusttrain.rundir.lock.RunDirBusyError: run_dir '...' is in use by another trainer in this process (its fit has not ended); ...
>>> release(d); (Path(d) / OWNER_NAME).exists()
True
>>> release(d, holder=first); (Path(d) / OWNER_NAME).exists()
False
"""

from __future__ import annotations

import atexit
import json
import os
import socket
import time
from pathlib import Path

from filelock import FileLock, Timeout

from robusttrain.errors import InputError
from robusttrain.io import atomic_write_text

LOCK_NAME = ".robusttrain.lock"
OWNER_NAME = ".robusttrain.owner"


class RunDirBusyError(InputError):
    """Another process holds the run directory."""


class RunLock:
    """The lock of one run directory, held by this process; see the module doc."""

    def __init__(self, run_dir: str | os.PathLike, command: str):
        self.run_dir = Path(run_dir)
        self.command = command
        self.interrupted: dict | None = None  # the owner record of a killed previous holder
        self.announced = False  # the CLI said it took the lock over (once)
        self.holders: set = set()
        self._lock = FileLock(self.run_dir / LOCK_NAME, timeout=0, thread_local=False)

    def acquire(self) -> RunLock:
        lock_path = self.run_dir / LOCK_NAME
        if lock_path.is_dir() or lock_path.is_symlink():
            raise InputError(
                f"cannot lock run_dir '{self.run_dir}': '{lock_path}' is a "
                f"{'folder' if lock_path.is_dir() else 'symbolic link'}; remove it"
            )
        for _ in range(5):
            try:
                self._lock.acquire()
            except Timeout:
                owner = _read_owner(self.run_dir)
                who = (
                    (
                        f"pid {owner.get('pid')} on {owner.get('host')}, {owner.get('command')} since "
                        f"{owner.get('since')}"
                    )
                    if owner
                    else "owner unknown"
                )
                raise RunDirBusyError(
                    f"run_dir '{self.run_dir}' is in use by another robusttrain command "
                    f"({who}); use another run_dir or wait for it to finish"
                ) from None
            # the file may have been unlinked by the previous holder between our open and flock:
            # then we hold a lock nobody else can see -- drop it and try again
            fd = self._lock._context.lock_file_fd
            assert fd is not None  # acquire() returned: filelock holds the lock file open
            try:
                same = os.path.samestat(os.fstat(fd), os.stat(lock_path))
            except OSError:
                same = False
            if same:
                break
            self._lock.release()
        else:
            raise InputError(f"cannot lock run_dir '{self.run_dir}': '{lock_path}' keeps changing")
        self.interrupted = _read_owner(self.run_dir)
        atomic_write_text(
            self.run_dir / OWNER_NAME,
            json.dumps(
                {
                    "pid": os.getpid(),
                    "host": socket.gethostname(),
                    "command": self.command,
                    "since": time.strftime("%Y-%m-%d %H:%M:%S"),
                }
            ),
        )
        return self

    def release(self) -> None:
        if not self._lock.is_locked:
            return
        (self.run_dir / OWNER_NAME).unlink(missing_ok=True)
        (self.run_dir / LOCK_NAME).unlink(missing_ok=True)  # while held: see the samestat check above
        self._lock.release(force=True)


def _read_owner(run_dir: Path) -> dict | None:
    """The owner record left in ``run_dir`` ({} when unreadable, None when absent)."""
    path = Path(run_dir) / OWNER_NAME
    if not path.is_file() or path.is_symlink():
        return None
    try:
        owner = json.loads(path.read_text())
    except (OSError, ValueError, UnicodeDecodeError):
        return {}
    return owner if isinstance(owner, dict) else {}


_held: dict[str, RunLock] = {}


def hold(run_dir: str | os.PathLike, command: str, holder: object = "cli") -> RunLock:
    """Take ``run_dir``'s lock for ``holder`` in this process, or raise :class:`RunDirBusyError`.

    The CLI calls it (holder ``"cli"``) before writing anything; the callbacks'
    :class:`~robusttrain.callbacks.context.RobustnessContext` calls it with the trainer as holder, so
    two trainers, in two processes or in one, cannot write one ``dirpath`` at once. Released by :func:`release` (the
    last holder), :func:`release_all`, at the latest when the process exits.
    """
    key = str(Path(run_dir).resolve())
    me = id(holder) if not isinstance(holder, str) else holder
    if key not in _held:
        Path(key).mkdir(parents=True, exist_ok=True)
        _held[key] = RunLock(key, command).acquire()
    elif not isinstance(me, str) and any(not isinstance(h, str) and h != me for h in _held[key].holders):
        # the kernel's lock cannot tell two trainers of one process apart: the holders can
        raise RunDirBusyError(
            f"run_dir '{key}' is in use by another trainer in this process (its fit has not ended); "
            "give this trainer another dirpath / default_root_dir, or let that fit end first"
        )
    _held[key].holders.add(me)
    return _held[key]


def release(run_dir: str | os.PathLike, holder: object = "cli") -> None:
    """``holder`` lets go (idempotent); the lock is released when no holder is left."""
    key = str(Path(run_dir).resolve())
    lock = _held.get(key)
    if lock is None:
        return
    lock.holders.discard(id(holder) if not isinstance(holder, str) else holder)
    if not lock.holders:
        del _held[key]
        lock.release()


def release_all() -> None:
    """Release every lock this process holds (end of a command, process exit)."""
    while _held:
        _held.popitem()[1].release()


atexit.register(release_all)
