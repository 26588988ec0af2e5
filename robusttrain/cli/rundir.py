"""Who owns the run directory: one command at a time (a lock), and which files each command writes.

* ``fit`` owns the training files: ``config.yaml``, ``logs/``, ``checkpoints/`` and the robustness
  files its callbacks write. ``validate``, ``test`` and ``check`` pointed at the same ``run_dir``
  write beside them (``config.<command>.yaml``, ``logs/<command>/``) and never touch fit's files.
* A second command on a run directory that is in use is refused (exit 2); a lock whose process is
  gone (a killed run) is taken over with a message, and the temporary files that run left behind
  (``.<name>.*.tmp`` from :mod:`robusttrain.io`) are removed. The lock records its process's start
  time (Linux ``/proc``), so a pid the system has since given to another process counts as gone.
* Under DDP the other ranks re-run the command in child processes (``LOCAL_RANK``/``NODE_RANK`` set):
  rank 0 holds the lock for all of them.
"""
from __future__ import annotations

import atexit
import json
import os
import socket
import sys
import time
from pathlib import Path

from robusttrain.cli.errors import UsageError

LOCK_NAME = ".robusttrain.lock"
TMP_GLOB = ".*.tmp"  # robusttrain.io's temp names: .<file name>.<random>.tmp in the file's folder
_EMPTY_LOCK_GRACE_S = 10.0  # a lock file being written right now is briefly empty


def config_name(command: str) -> str:
    """The resolved-config file a command writes: ``config.yaml`` for fit, else ``config.<command>.yaml``."""
    return "config.yaml" if command == "fit" else f"config.{command}.yaml"


def logger_version(command: str) -> str:
    """Loggers' ``version`` (sub-folder): fit logs to ``logs/``, others to ``logs/<command>/``."""
    return "" if command == "fit" else command


def is_child_rank() -> bool:
    """True in the processes Lightning starts for DDP ranks > 0 (they share rank 0's run dir)."""
    return os.environ.get("LOCAL_RANK", "0") != "0" or os.environ.get("NODE_RANK", "0") != "0"


def process_start(pid: int) -> int | None:
    """When process ``pid`` started (clock ticks since boot, ``/proc/<pid>/stat``); None if unknown.

    >>> process_start(os.getpid()) == process_start(os.getpid()) is not None or sys.platform != "linux"
    True
    """
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
        # the command name (field 2) may hold spaces and parentheses: fields after its last ")"
        return int(stat[stat.rindex(")") + 2:].split()[19])
    except (OSError, ValueError, IndexError):
        return None


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # exists, owned by someone else
        return True
    return True


class RunDirLock:
    """An exclusive lock file (pid, host, command) in a run directory; see the module doc."""

    def __init__(self, run_dir: str | os.PathLike, command: str):
        self.path = Path(run_dir) / LOCK_NAME
        self.command = command
        self.held = False

    def acquire(self) -> str | None:
        """Take the lock or raise UsageError; returns a message when a stale lock was taken over."""
        note = None
        for _ in range(3):
            try:
                fd = os.open(self.path, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644)
            except FileExistsError:
                note = self._stale_or_refuse()
                continue
            with os.fdopen(fd, "w") as fh:
                json.dump({"pid": os.getpid(), "start": process_start(os.getpid()), "host": socket.gethostname(),
                           "command": self.command, "since": time.strftime("%Y-%m-%d %H:%M:%S")}, fh)
            self.held = True
            atexit.register(self.release)
            return note
        raise UsageError(f"cannot lock run_dir '{self.path.parent}' (lock file {self.path} keeps changing)")

    def _stale_or_refuse(self) -> str:
        try:
            text = self.path.read_text()
            age = time.time() - self.path.stat().st_mtime
        except FileNotFoundError:
            return ""  # released meanwhile: try again
        try:
            owner = json.loads(text)
            pid, host = int(owner["pid"]), str(owner["host"])
        except (ValueError, KeyError, TypeError):
            if age < _EMPTY_LOCK_GRACE_S:
                raise UsageError(f"run_dir '{self.path.parent}' is being locked by another command right "
                                 "now; use another run_dir or wait for it to finish") from None
            owner, pid, host = {}, -1, socket.gethostname()
        if host != socket.gethostname():
            raise UsageError(f"run_dir '{self.path.parent}' is in use by pid {pid} on host {host} "
                             f"({owner.get('command')} since {owner.get('since')}); use another run_dir, "
                             f"or delete {self.path} if that run is gone")
        start = owner.get("start")
        reused = start is not None and process_start(pid) not in (None, int(start))  # pid now another process
        if pid > 0 and _alive(pid) and not reused:
            raise UsageError(f"run_dir '{self.path.parent}' is in use by another robusttrain command "
                             f"(pid {pid}, {owner.get('command')} since {owner.get('since')}); use another "
                             "run_dir or wait for it to finish")
        self.path.unlink(missing_ok=True)
        return (f"[robusttrain] run_dir {self.path.parent}: took over the lock of an interrupted run "
                f"(pid {pid if pid > 0 else '?'}, {owner.get('command', '?')} since {owner.get('since', '?')}, "
                "no longer running)")

    def release(self) -> None:
        if self.held:
            self.held = False
            try:
                owner = json.loads(self.path.read_text())
                if int(owner.get("pid", -1)) == os.getpid():
                    self.path.unlink()
            except (OSError, ValueError):
                pass


def remove_stale_temp_files(run_dir: str | os.PathLike) -> int:
    """Delete temp files a killed run left (only robusttrain.io's ``.<name>.<rand>.tmp`` names)."""
    n = 0
    for p in Path(run_dir).rglob(TMP_GLOB):
        if p.is_file() and not p.is_symlink():
            p.unlink(missing_ok=True)
            n += 1
    return n


_held: dict[str, RunDirLock] = {}


def claim(run_dir: Path, command: str) -> None:
    """Lock ``run_dir`` for ``command`` (rank 0 only) and clean up after an interrupted run.

    Called before anything is written into the run directory; released when the command ends.
    """
    if is_child_rank() or str(run_dir) in _held:
        return
    lock = RunDirLock(run_dir, command)
    note = lock.acquire()
    _held[str(run_dir)] = lock
    if note:
        print(note, file=sys.stderr, flush=True)
    n = remove_stale_temp_files(run_dir)
    if n:
        print(f"[robusttrain] run_dir {run_dir}: removed {n} temporary file(s) left by an interrupted run",
              file=sys.stderr, flush=True)


def release_all() -> None:
    """Release every lock this process holds (end of a command)."""
    while _held:
        _held.popitem()[1].release()
