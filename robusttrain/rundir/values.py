"""Values a run cannot have, refused where a run-directory file is read (one line naming file, key, value).

A torn row is refused by :mod:`.csv_table`; a well-formed file can still hold numbers no run writes --
an epoch of ``1e300`` or ``-7``, a count of ``1e308`` (which an ``int`` cast turns into
``-9223372036854775808``), a checkpoint named outside the run directory. The readers check them here and
raise :class:`~robusttrain.rundir.paths.RunDirFileError`, so ``report`` and ``corners`` stop with one line
instead of rendering them.

>>> epoch("corner_cases.json", "balanced_epoch", 3), epochs("b.json", "averaged_epochs", [0, 2.0])
(3, [0, 2])
>>> epochs("b.json", "averaged_epochs", [0, 1e300, -7])
Traceback (most recent call last):
...
robusttrain.rundir.paths.RunDirFileError: run-directory file 'b.json': averaged_epochs holds 1e+300, which no run writes (expected an epoch number, an integer from 0 to 1000000)
>>> own_file("b.json", "checkpoint", "../../etc/passwd", ("balanced.ckpt",))
Traceback (most recent call last):
...
robusttrain.rundir.paths.RunDirFileError: run-directory file 'b.json': checkpoint is '../../etc/passwd', which no run writes (expected one of balanced.ckpt, or null)
"""

from __future__ import annotations

import math
import re
from collections.abc import Iterable
from typing import Any

import numpy as np
import pandas as pd

from .paths import RunDirFileError

MAX_EPOCH = 1_000_000  # no run validates a million epochs: a larger "epoch" is not one a run wrote
MAX_COUNT = 2**53  # the largest integer a float (a CSV cell read by pandas) holds exactly


def _refuse(where: str, key: str, value: Any, expected: str) -> RunDirFileError:
    shown = (
        f"{value:g}" if isinstance(value, float) else repr(value) if isinstance(value, str) else str(value)
    )
    return RunDirFileError(
        f"run-directory file '{where}': {key} holds {shown}, which no run writes (expected {expected})"
    )


def _integer(where: str, key: str, value: Any, top: int, expected: str) -> int:
    ok = isinstance(value, (int, float, np.integer, np.floating)) and not isinstance(value, (bool, np.bool_))
    if not ok or not math.isfinite(float(value)) or float(value) != int(value) or not 0 <= value <= top:
        raise _refuse(where, key, value, expected)
    return int(value)


def epoch(where: str, key: str, value: Any, optional: bool = True) -> int | None:
    """An epoch number (an integer 0..:data:`MAX_EPOCH`); None stays None when ``optional``."""
    if value is None and optional:
        return None
    return _integer(where, key, value, MAX_EPOCH, f"an epoch number, an integer from 0 to {MAX_EPOCH}")


def epochs(where: str, key: str, value: Any) -> list[int]:
    """A list of epoch numbers (None or absent: an empty list)."""
    if value is None:
        return []
    if not isinstance(value, list):
        raise _refuse(where, key, value, "a list of epoch numbers")
    return [epoch(where, key, v, optional=False) for v in value]  # type: ignore[misc]


def within(where: str, key: str, values: Iterable[int], allowed: Iterable[int], what: str) -> None:
    """Every epoch of ``values`` is one of ``allowed`` (e.g. averaged epochs are window epochs)."""
    extra = sorted(set(values) - set(allowed))
    if extra:
        raise RunDirFileError(
            f"run-directory file '{where}': {key} holds epoch {extra[0]}, which is not one of the {what} "
            f"({sorted(set(allowed)) or 'none'}): no run writes that"
        )


def own_file(
    where: str, key: str, value: Any, allowed: Iterable[str], pattern: str | None = None
) -> str | None:
    """A file name the run's writer records: one of ``allowed`` or a full match of ``pattern``
    (relative, inside the run directory), or None."""
    if value is None:
        return None
    allowed = tuple(allowed)
    if isinstance(value, str) and (
        value in allowed or (pattern is not None and re.fullmatch(pattern, value))
    ):
        return value
    listed = ", ".join([*allowed, *([pattern] if pattern else [])])
    raise RunDirFileError(
        f"run-directory file '{where}': {key} is {value!r}, which no run writes (expected one of {listed}, or null)"
    )


def counts(where: str, frame: pd.DataFrame, columns: Iterable[str]) -> None:
    """The ``columns`` of a CSV table hold counts (integers 0..:data:`MAX_COUNT`; empty cells allowed)."""
    for col in columns:
        if col not in frame:
            continue
        cells = pd.to_numeric(frame[col], errors="coerce")
        for row, (raw, v) in enumerate(zip(frame[col], cells), start=2):  # line 1 is the header
            if pd.isna(raw):
                continue
            if pd.isna(v) or not math.isfinite(v) or v != int(v) or not 0 <= v <= MAX_COUNT:
                shown = raw if isinstance(raw, str) else f"{float(raw):g}"
                raise RunDirFileError(
                    f"run-directory file '{where}' line {row}: {col} holds {shown}, which no run writes "
                    f"(expected a count, an integer from 0 to {MAX_COUNT})"
                )
