"""Argument checks, one home for callbacks, datamodules and analysis: one line naming the argument,
the value and what was expected (the CLI maps it to the recipe key it names).

``owner`` (optional) prefixes the class that refused the value; ``why`` (optional) says what the
argument means. Lists of valid values live beside the code that defines them (``cornercases.POLICIES``,
``cornercases.ecod.TAILS`` ...) and are passed to :func:`check_choice`, never copied.

>>> check_fraction("replay_ratio", 0.2, hi=0.9)
0.2
>>> check_fraction("replay_ratio", 1.0, hi=0.9)
Traceback (most recent call last):
...
ValueError: replay_ratio=1.0: expected a number in [0, 0.9]
>>> check_int("batch_size", 0, 1, owner="PolypDataModule")
Traceback (most recent call last):
...
ValueError: PolypDataModule: batch_size=0: expected an integer >= 1
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any, TypeVar

import numpy as np

T = TypeVar("T")


def _fail(name: str, value: Any, expected: str, owner: str | None, why: str) -> ValueError:
    head = f"{owner}: " if owner else ""
    return ValueError(f"{head}{name}={value!r}: expected {expected}" + (f" ({why})" if why else ""))


def _float(value: Any) -> float:
    try:
        return float(value)
    except (TypeError, ValueError):
        return math.nan


def check_int(name: str, value: Any, lo: int | None = 0, *, owner: str | None = None, why: str = "") -> int:
    """An int ``>= lo`` (no bound with ``lo=None``); integral floats are accepted, bools refused."""
    ok = isinstance(value, (int, np.integer)) and not isinstance(value, bool)
    if isinstance(value, float) and value.is_integer():
        ok = True
    if not ok or (lo is not None and int(value) < lo):
        raise _fail(name, value, "an integer" if lo is None else f"an integer >= {lo}", owner, why)
    return int(value)


def check_fraction(
    name: str,
    value: Any,
    lo: float = 0.0,
    hi: float = 1.0,
    lo_open: bool = False,
    hi_open: bool = False,
    *,
    owner: str | None = None,
    why: str = "",
) -> float:
    """A finite number in ``[lo, hi]``; ``lo_open`` / ``hi_open`` exclude an end."""
    v = _float(value)
    bad = (
        isinstance(value, bool)
        or not math.isfinite(v)
        or v < lo
        or v > hi
        or (lo_open and v == lo)
        or (hi_open and v == hi)
    )
    if bad:
        interval = f"{'(' if lo_open else '['}{lo:g}, {hi:g}{')' if hi_open else ']'}"
        raise _fail(name, value, f"a number in {interval}", owner, why)
    return v


def check_number(name: str, value: Any, lo: float = 0.0, *, owner: str | None = None, why: str = "") -> float:
    """A finite number ``>= lo``."""
    v = _float(value)
    if isinstance(value, bool) or not (math.isfinite(v) and v >= lo):
        raise _fail(name, value, f"a number >= {lo:g}", owner, why)
    return v


def check_choice(name: str, value: T, choices: Sequence[T], *, owner: str | None = None, why: str = "") -> T:
    """``value`` if it is one of ``choices``."""
    if value not in choices:
        raise _fail(name, value, f"one of {', '.join(map(repr, choices))}", owner, why)
    return value
