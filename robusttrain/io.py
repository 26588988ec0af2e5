"""Atomic file writes: a killed run never leaves a half-written file that a resume would trust.

Temp files are named ``.<file name>.<8 random chars>.robusttrain.tmp`` in the target's folder
(:data:`TMP_PATTERN`): the only names the run-directory cleanup ever removes.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import shutil
import signal
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

TMP_SUFFIX = ".robusttrain.tmp"
TMP_PATTERN = re.compile(r"^\..+\.[A-Za-z0-9_]{8}" + re.escape(TMP_SUFFIX) + "$")
_UMASK = os.umask(0)
os.umask(_UMASK)


def _atomic(path: str | os.PathLike, write: Callable[[Any], None], mode: str) -> Path:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=TMP_SUFFIX, dir=path.parent)
    try:
        with os.fdopen(fd, mode) as fh:
            write(fh)
            fh.flush()
            os.fsync(fh.fileno())
        kill_point(f"write:{path.name}")
        os.chmod(tmp, 0o666 & ~_UMASK)  # mkstemp creates 0600; give the file the usual permissions
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
        raise
    return path


KILL_ENV = "ROBUSTTRAIN_TEST_KILL_AT"
KILL_SIGNAL_ENV = "ROBUSTTRAIN_TEST_KILL_SIGNAL"  # TERM: send SIGTERM instead (the graceful path)
_kill_counts: dict[str, int] = {}


def kill_point(name: str) -> None:
    """Fault injection for the kill tests: ``ROBUSTTRAIN_TEST_KILL_AT=NAME:N`` SIGKILLs this process
    the N-th time it reaches ``kill_point(NAME)`` (no-op otherwise; ``ROBUSTTRAIN_TEST_KILL_SIGNAL=TERM``
    sends SIGTERM instead). Every atomic write passes
    ``write:<file name>`` after its temp file is complete and before it replaces the file; the CSV
    logger passes ``log:metrics.csv`` before it writes each logged row (e.g. every training step).

    >>> kill_point("write:history.csv")   # not armed: nothing happens
    """
    spec = os.environ.get(KILL_ENV)
    if not spec or spec.rpartition(":")[0] != name:
        return
    _kill_counts[name] = _kill_counts.get(name, 0) + 1
    if str(_kill_counts[name]) == spec.rpartition(":")[2]:
        term = os.environ.get(KILL_SIGNAL_ENV) == "TERM"
        os.kill(os.getpid(), signal.SIGTERM if term else signal.SIGKILL)


def atomic_write_text(path: str | os.PathLike, text: str) -> Path:
    """Write ``text`` to ``path`` atomically (temp file in the same folder, then rename).

    >>> import tempfile, pathlib
    >>> p = pathlib.Path(tempfile.mkdtemp()) / "a.txt"
    >>> _ = atomic_write_text(p, "hi"); p.read_text()
    'hi'
    """
    return _atomic(path, lambda fh: fh.write(text), "w")


def atomic_write_bytes(path: str | os.PathLike, data: bytes) -> Path:
    """Write ``data`` to ``path`` atomically."""
    return _atomic(path, lambda fh: fh.write(data), "wb")


def atomic_copy(src: str | os.PathLike, dst: str | os.PathLike) -> Path:
    """Copy ``src`` to ``dst`` atomically (``write:<dst name>`` kill point included).

    >>> import tempfile, pathlib
    >>> d = pathlib.Path(tempfile.mkdtemp()); _ = atomic_write_text(d / "a", "x")
    >>> atomic_copy(d / "a", d / "b").read_text()
    'x'
    """
    with open(src, "rb") as fh:
        return _atomic(dst, lambda out: shutil.copyfileobj(fh, out), "wb")


def atomic_write_json(path: str | os.PathLike, obj: Any) -> Path:
    """Write ``obj`` as indented JSON atomically."""
    return atomic_write_text(path, json.dumps(obj, indent=2, sort_keys=False, default=json_default) + "\n")


def atomic_write_csv(path: str | os.PathLike, frame: Any) -> Path:
    """Write a pandas DataFrame as CSV (no index) atomically."""
    return atomic_write_text(path, frame.to_csv(index=False))


def json_default(obj: Any) -> Any:
    """``json.dumps(default=)`` for numpy scalars / arrays and tensors (they show up in analysis
    results): plain JSON values."""
    if hasattr(obj, "tolist"):
        return obj.tolist()
    if hasattr(obj, "item"):
        return obj.item()
    raise TypeError(f"not JSON serialisable: {type(obj).__name__}")
