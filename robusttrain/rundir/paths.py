"""The one way robusttrain reads a file of a run directory: a run directory is untrusted data.

:func:`locate` / :func:`read_text` / :func:`read_bytes` refuse a name that leaves the run directory
(absolute, ``..``), a symbolic link anywhere below the run directory (a shared run could point
``efr_table.csv`` at any file of the recipient), anything but a regular file, and (text) bytes that
are not UTF-8 -- each with a :class:`RunDirFileError` naming the file. A missing file is ``None``.
:func:`inside` is the lenient form for optional files named *inside* run-directory files (thumbnails):
None instead of an error.

>>> import tempfile, pathlib, os
>>> d = pathlib.Path(tempfile.mkdtemp()); _ = (d / "a.png").write_bytes(b"x")
>>> inside(d, "a.png") is not None, inside(d, "/etc/passwd"), inside(d, "../a.png")
(True, None, None)
>>> os.symlink("/etc/hostname", d / "efr.csv")
>>> read_text(d, "efr.csv")
Traceback (most recent call last):
...
robusttrain.rundir.paths.RunDirFileError: run-directory file '...efr.csv' is a symbolic link; robusttrain reads only regular files inside the run directory
"""

from __future__ import annotations

import json
import logging
import os
import stat
from pathlib import Path, PurePath

from robusttrain.errors import InputError

MAX_BYTES = 2 * 1024**3  # a run-directory table larger than this is not one robusttrain wrote


class RunDirFileError(InputError):
    """A run-directory file robusttrain refuses to read (symlink, outside, not a file, garbage)."""


def locate(run_dir: str | os.PathLike, name: str | os.PathLike) -> Path | None:
    """``run_dir / name`` if it is a regular file reached without symlinks; None when absent."""
    root = Path(run_dir).resolve()  # the run directory itself may be a link the user chose
    rel = PurePath(name)
    if rel.is_absolute() or ".." in rel.parts or not rel.parts:
        raise RunDirFileError(f"run-directory file name '{name}' leaves the run directory '{root}'")
    p = root
    for part in rel.parts:
        p = p / part
        try:
            st = os.lstat(p)
        except FileNotFoundError:
            return None
        except OSError as e:
            raise RunDirFileError(f"cannot read run-directory file '{p}': {e.strerror}") from None
        if stat.S_ISLNK(st.st_mode):
            raise RunDirFileError(
                f"run-directory file '{p}' is a symbolic link; robusttrain reads only "
                "regular files inside the run directory"
            )
    if not stat.S_ISREG(st.st_mode):
        raise RunDirFileError(f"run-directory file '{p}' is not a regular file")
    return p


def read_bytes(run_dir: str | os.PathLike, name: str | os.PathLike) -> bytes | None:
    """The file's bytes (opened without following a link swapped in meanwhile), or None when absent."""
    p = locate(run_dir, name)
    if p is None:
        return None
    try:
        fd = os.open(p, os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0))
        with os.fdopen(fd, "rb") as fh:
            data = fh.read(MAX_BYTES + 1)
    except OSError as e:
        raise RunDirFileError(f"cannot read run-directory file '{p}': {e.strerror}") from None
    if len(data) > MAX_BYTES:
        raise RunDirFileError(f"run-directory file '{p}' is larger than {MAX_BYTES} bytes")
    return data


def read_text(run_dir: str | os.PathLike, name: str | os.PathLike) -> str | None:
    """The file as UTF-8 text, or None when absent; bytes that are not UTF-8 are refused by offset."""
    data = read_bytes(run_dir, name)
    if data is None:
        return None
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as e:
        raise RunDirFileError(
            f"run-directory file '{Path(run_dir).resolve() / name}' is not text (byte "
            f"0x{data[e.start]:02x} at offset {e.start} is not UTF-8)"
        ) from None


def read_json_object(run_dir: str | os.PathLike, name: str) -> dict | None:
    """A run-directory JSON file's object, or None when absent, unreadable or not an object (a warning
    names the file): the reader of the small end-of-fit records (``balanced_average.json``, ``ema.json``)."""
    try:
        text = read_text(run_dir, name)
        obj = None if text is None else json.loads(text)
    except (RunDirFileError, json.JSONDecodeError) as err:
        logging.getLogger(__name__).warning("cannot read %s: %s", Path(run_dir) / name, err)
        return None
    return obj if isinstance(obj, dict) else None


def inside(run_dir: str | os.PathLike, path: str | os.PathLike | None) -> Path | None:
    """``path`` (relative to ``run_dir``, or absolute under it) as a regular file inside ``run_dir``
    reached without symlinks, else None (also for ``..``): for optional files such as thumbnails."""
    if not path:
        return None
    if Path(path).is_absolute():  # the readers hand out absolute paths of files they found inside
        try:
            path = Path(path).relative_to(Path(run_dir).resolve())
        except ValueError:
            return None
    try:
        return locate(run_dir, path)
    except RunDirFileError:
        return None
