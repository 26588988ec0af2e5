"""The validation Dice a user reads: per case, then the mean over cases (``val/dice``).

``history.csv``, ``check`` and the report all score a case from its own pixel sums (all slices of
a volume together) and average the cases; a Dice pooled over every pixel of the set weighs large
lesions more and is a different number for the same weights. So the model's headline ``val/dice``
is the per-case mean (:class:`CaseDice`, the same sums and Dice as
:class:`~robusttrain.metamorphic.scoring.CaseScores`), and the pooled Dice, still logged for the
papers' tables, is named ``val/dice_pooled``.

>>> import torch
>>> cd = CaseDice()
>>> logits = torch.zeros(2, 2, 2, 2); logits[:, 1, 0] = 1.0          # both predict the top row
>>> mask = torch.zeros(2, 2, 2, dtype=torch.long); mask[0, 0] = 1    # only case a has a lesion there
>>> mask[1, 1] = 1                                                   # case b's is the bottom row
>>> cd.update({"case_id": ["a", "b"]}, logits, mask)
>>> per_class, n = cd.compute()
>>> per_class.tolist(), n                                           # (1.0 + 0.0) / 2 over 2 cases
([0.5], 2)
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch

from robusttrain.metamorphic.batch import case_id_list
from robusttrain.metamorphic.scoring import CaseScores, dice_from_sums, logits_sums

Key = tuple[str, Any]


class CaseDice:
    """Per-case pixel sums of one validation (or test) pass; :meth:`compute` gives the per-class
    mean over cases of the per-case Dice and the number of cases.

    A sample without ``case_id`` is its own case, named ``idx<n>`` by its position in the pass (as the
    MetamorphicCallback names it). Sums are keyed by (case, ``slice_index``) when the batch has one, so
    a slice a DistributedSampler repeats to pad a rank is counted once.
    """

    def __init__(self) -> None:
        self.reset()

    def reset(self) -> None:
        self._sums: dict[Key, np.ndarray] = {}
        self._seen = 0

    def update(self, batch: Any, logits: torch.Tensor, mask: torch.Tensor, rank: int = 0) -> None:
        sums = logits_sums(logits.detach(), mask)
        n = len(sums)
        ids = batch.get("case_id") if isinstance(batch, dict) else None
        cids = case_id_list(ids) if ids is not None else [f"idx{self._seen + i}" for i in range(n)]
        slices = batch.get("slice_index") if isinstance(batch, dict) else None
        for i, s in enumerate(sums):
            # without a slice index every sample adds (a volume is one sample); the rank and position
            # keep two ranks' samples apart
            sl = int(slices[i]) if slices is not None else ("r", rank, self._seen + i)
            key = (str(cids[i]), sl)
            self._sums[key] = s
        self._seen += n

    @property
    def parts(self) -> dict[Key, np.ndarray]:
        """The keyed sums of this process (what a DDP gather collects)."""
        return self._sums

    @staticmethod
    def merge(parts: list[dict[Key, np.ndarray]]) -> tuple[np.ndarray, int]:
        """Every rank's :attr:`parts` -> (mean over cases of the per-case Dice per foreground class,
        number of cases); an empty pass gives (an empty array, 0)."""
        merged: dict[Key, np.ndarray] = {}
        for part in parts:
            merged.update(part)
        cases = CaseScores([])
        for (cid, _), s in sorted(merged.items(), key=lambda kv: str(kv[0])):
            cases.add([cid], s[None])
        if not cases.sums:
            return np.zeros(0), 0
        per_case = np.stack([dice_from_sums(s) for s in cases.sums.values()])  # (cases, classes)
        return per_case.mean(axis=0), len(cases.sums)

    def compute(self) -> tuple[np.ndarray, int]:
        """One process' :meth:`merge`."""
        return self.merge([self._sums])
