"""Argument checks the callbacks run when they are built: one line naming the argument and value.

>>> check_fraction("replay_ratio", 0.2, hi=0.9)
0.2
>>> check_fraction("replay_ratio", 1.0, hi=0.9)
Traceback (most recent call last):
...
ValueError: replay_ratio=1.0: expected a number in [0, 0.9]
"""
from __future__ import annotations

import math
from typing import Any, Sequence


def check_int(name: str, value: Any, lo: int = 0) -> int:
    """An int >= ``lo`` (bools refused)."""
    if isinstance(value, bool) or not isinstance(value, int) and not (
            isinstance(value, float) and value.is_integer()):
        raise ValueError(f"{name}={value!r}: expected an integer >= {lo}")
    if int(value) < lo:
        raise ValueError(f"{name}={value!r}: expected an integer >= {lo}")
    return int(value)


def check_fraction(name: str, value: Any, lo: float = 0.0, hi: float = 1.0, lo_open: bool = False) -> float:
    """A finite number in ``[lo, hi]`` (``(lo, hi]`` with ``lo_open``)."""
    try:
        v = float(value)
    except (TypeError, ValueError):
        v = math.nan
    if isinstance(value, bool) or not math.isfinite(v) or v > hi or v < lo or (lo_open and v == lo):
        left = "(" if lo_open else "["
        raise ValueError(f"{name}={value!r}: expected a number in {left}{lo:g}, {hi:g}]")
    return v


def check_choice(name: str, value: Any, choices: Sequence[Any]) -> Any:
    if value not in choices:
        raise ValueError(f"{name}={value!r}: expected one of {', '.join(map(repr, choices))}")
    return value
