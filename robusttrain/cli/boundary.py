"""The one error boundary every command runs inside: each expected failure is one line and an exit code.

=====  =====================================================================================
code   meaning
=====  =====================================================================================
0      done
2      bad input the user can fix: recipe, key, value, path, checkpoint, data, run-directory file
3      the system refused a file operation: disk full, read-only, permission denied, a file
       where a folder should be (or the reverse); the line names the path
130    stopped by Ctrl-C (SIGINT), after the graceful path (``fit ckpt=last`` resumes)
143    stopped by SIGTERM (``docker stop``, SLURM preemption, ``timeout``): the same graceful path
=====  =====================================================================================

SIGINT and SIGTERM both raise :class:`KeyboardInterrupt` in the main thread, so Lightning's
graceful shutdown (callbacks' ``on_exception``, loggers finalized) runs for either; the signal
that arrived decides the exit code. A second signal during that shutdown is ignored.

>>> os_error_line(OSError(28, "No space left on device", "/runs/a/history.csv"))
"disk full (No space left on device) writing '/runs/a/history.csv'; free space or use another run_dir"
"""

from __future__ import annotations

import contextlib
import errno
import os
import signal
from pathlib import Path
from typing import Any

EXIT_INPUT, EXIT_SYSTEM, EXIT_SIGINT, EXIT_SIGTERM = 2, 3, 130, 143


class Stopped:
    """Which stop signal arrived (None: none); installed for the duration of one command."""

    def __init__(self) -> None:
        self.signal: int | None = None
        self._pid = os.getpid()
        self._previous: dict[int, Any] = {}  # signal -> the handler it had

    def _handler(self, signum, frame) -> None:
        if os.getpid() != self._pid or self.signal is not None:
            return  # a forked worker, or a second signal during the graceful shutdown
        self.signal = signum
        raise KeyboardInterrupt

    def install(self) -> Stopped:
        for s in (signal.SIGINT, signal.SIGTERM):
            # ValueError: not the main thread (e.g. main() called from a worker thread)
            with contextlib.suppress(ValueError):
                self._previous[s] = signal.signal(s, self._handler)
        return self

    def restore(self) -> None:
        for s, h in self._previous.items():
            signal.signal(s, h)

    def exit_code(self) -> int:
        return EXIT_SIGTERM if self.signal == signal.SIGTERM else EXIT_SIGINT

    def name(self) -> str:
        return "SIGTERM" if self.signal == signal.SIGTERM else "Ctrl-C (SIGINT)"


_HINTS = {
    errno.ENOSPC: ("disk full", "free space or use another run_dir"),
    errno.EDQUOT: ("disk quota exceeded", "free space or use another run_dir"),
    errno.EROFS: ("read-only file system", "use a writable run_dir / out="),
    errno.EACCES: ("permission denied", "check the folder's permissions or use another path"),
    errno.EPERM: ("operation not permitted", "check the folder's permissions or use another path"),
    errno.ENOTDIR: ("a file is where a folder should be", "move that file away"),
    errno.EISDIR: ("a folder is where a file should be", "move that folder away"),
    errno.EEXIST: ("a file is in the way", "move it away"),
    errno.ENAMETOOLONG: ("file name too long", "use a shorter run_dir"),
}


def os_error_line(e: OSError) -> str:
    """One line for a refused file operation, naming the path (and, for ENOTDIR, the file in the way)."""
    what, fix = _HINTS.get(e.errno or 0, ("file system error", "check the path"))
    path = e.filename
    if e.errno in (errno.ENOTDIR, errno.EEXIST) and path:
        blocker = next((p for p in (Path(path), *Path(path).parents) if p.exists() and not p.is_dir()), None)
        if blocker is not None:
            return f"'{blocker}' is a file where a folder should be ({e.strerror}); move that file away"
    where = f" writing '{path}'" if path else ""
    if e.filename2:
        where += f" -> '{e.filename2}'"
    return f"{what} ({e.strerror or e}){where}; {fix}"


def is_system_error(e: BaseException) -> bool:
    return isinstance(e, OSError) and e.errno in _HINTS
