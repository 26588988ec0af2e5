"""FailureRecord: one metamorphic-relation violation, the unit the failure bank stores and replays."""

from __future__ import annotations

import hashlib
from dataclasses import asdict, dataclass, field
from typing import Any

import numpy as np


@dataclass
class FailureRecord:
    """A follow-up whose score dropped by more than the threshold relative to its source.

    ``params`` holds the exact per-sample perturbation parameters (numpy path schema, as
    lists so the record is JSON-able); ``index``/``slice_index`` locate the source sample in
    its dataset so the follow-up can be re-created from the original image.

    >>> r = FailureRecord(case_id="c1", split="train", perturbation="blur", severity=4,
    ...                   params={"sigma": [3.0]}, seed=7, epoch=2, src_dice=0.9, fol_dice=0.3,
    ...                   src_iou=0.8, fol_iou=0.2)
    >>> round(r.drop, 3)
    0.667
    """

    case_id: str
    split: str  # "train" or "val" (or an extra validation set's name)
    perturbation: str
    severity: int
    params: dict[str, Any]
    seed: int
    epoch: int
    src_dice: float
    fol_dice: float
    src_iou: float
    fol_iou: float
    index: int = -1  # dataset index of the source sample (-1: unknown)
    slice_index: int = 0
    extra: dict[str, Any] = field(default_factory=dict)

    @property
    def drop(self) -> float:
        """Relative Dice drop (src - fol) / src, the quantity the MR threshold applies to."""
        return relative_drop(self.src_dice, self.fol_dice)

    @property
    def key(self) -> tuple:
        """Identity for de-duplication: same case, perturbation and parameters."""
        return (self.case_id, self.slice_index, self.perturbation, self.severity, _freeze(self.params))

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["params"] = {k: np.asarray(v).tolist() for k, v in self.params.items()}
        d["drop"] = self.drop
        return d

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> FailureRecord:
        d = dict(d)
        d.pop("drop", None)
        return cls(**d)


def failure_id(record: FailureRecord) -> str:
    """Short stable id of a record's de-duplication key: the failure bank's ids, its thumbnail names
    and the W&B failure table's de-duplication all use it.

    >>> r = FailureRecord("c1", "train", "blur", 4, {"sigma": [3.0]}, 7, 2, 0.9, 0.3, 0.8, 0.2)
    >>> failure_id(r) == failure_id(FailureRecord.from_dict({**r.to_dict(), "epoch": 5}))  # epoch is not identity
    True
    """
    return hashlib.sha1(repr(record.key).encode()).hexdigest()[:16]


def relative_drops(src: Any, fol: Any) -> np.ndarray:
    """The relative drop (src - fol) / src, element-wise; 0 where the source score is <= 0 (nothing
    to lose, no error). The one definition of the quantity the MR threshold applies to (EFR, failure
    records, the report, the W&B table).

    >>> relative_drops([0.8, 0.0, 0.5], [0.4, 0.3, 0.5]).tolist()
    [0.5, 0.0, 0.0]
    """
    s = np.asarray(src, dtype=np.float64)
    f = np.asarray(fol, dtype=np.float64)
    return np.where(s > 0, (s - f) / np.where(s > 0, s, 1.0), 0.0)


def relative_drop(src: float, fol: float) -> float:
    """:func:`relative_drops` of one pair, as a float."""
    return float(relative_drops(src, fol))


def _freeze(params: dict[str, Any]) -> tuple:
    return tuple(
        sorted((k, tuple(np.asarray(v, dtype=float).round(6).ravel().tolist())) for k, v in params.items())
    )
