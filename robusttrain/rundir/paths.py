"""Paths named *inside* run-directory files are only trusted when they stay inside the run directory."""
from __future__ import annotations

import os
from pathlib import Path


def inside(run_dir: str | os.PathLike, path: str | os.PathLike | None) -> Path | None:
    """``path`` (relative to ``run_dir`` or absolute) as an existing file inside ``run_dir``, else None.

    The report embeds files; which ones must not be up to the contents of a run's files (a path in
    ``failures.jsonl`` could name any file on the machine). Symlinks are resolved first.

    >>> import tempfile, pathlib
    >>> d = pathlib.Path(tempfile.mkdtemp()); _ = (d / "a.png").write_bytes(b"x")
    >>> inside(d, "a.png") is not None, inside(d, "/etc/passwd"), inside(d, "../a.png")
    (True, None, None)
    """
    if not path:
        return None
    root = Path(run_dir).resolve()
    try:
        p = (root / path).resolve()
    except (OSError, RuntimeError, ValueError):
        return None
    return p if p.is_relative_to(root) and p.is_file() else None
