"""What metamorphic training drew and kept, per family and epoch: the counts behind
``metamorphic_training.csv`` and the rows of ``metamorphic_training_samples.jsonl``
(:mod:`robusttrain.rundir.metamorphic_training`). No trainer here: the callback feeds each step's
follow-ups in, gathers the ranks' rows and writes the files.

>>> rows = [{"epoch": 0, "family": "blur", "candidates": 4, "chosen": 1, "rejected": 0, "score": 0.5,
...          "nscore": 4, "chosen_score": 0.2, "weight": 0.5}] * 2   # two ranks
>>> merge_rows(rows)[0]["candidates"], merge_rows(rows)[0]["mean_score"], merge_rows(rows)[0]["mean_chosen_score"]
(8, 0.125, 0.2)
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import pandas as pd
import torch

from .worst_of_k import Followups, WorstOfK, jsonable

SUMMED = ("candidates", "chosen", "rejected", "score", "nscore", "chosen_score")


class FamilyCounts:
    """Per-family counts and score sums of one epoch's follow-ups, kept on the device (read once per
    epoch): candidates drawn, chosen (kept), rejected (too much of the lesion covered), the candidates'
    and the chosen ones' summed scores, and the family weights of the latest step."""

    def __init__(self) -> None:
        self.acc: dict[str, Any] = {}

    def reset(self) -> None:
        self.acc = {}

    def add(self, wok: WorstOfK, fol: Followups, rates: Mapping[str, float] | None) -> None:
        """Count one step's follow-ups ``fol`` of sampler ``wok`` (drawn with family ``rates``)."""
        fams = wok.labels
        dev = fol.images.device
        if "cand" not in self.acc:
            z = lambda: torch.zeros(len(fams), dtype=torch.float64, device=dev)
            self.acc = {
                "cand": [0] * len(fams),
                "chosen": z(),
                "rejected": z(),
                "score": z(),
                "nscore": z(),
                "chosen_score": z(),
            }
        pos = {f: i for i, f in enumerate(fams)}
        fam_idx = torch.tensor([[pos[f] for f in row] for row in fol.families], dtype=torch.long)
        for j in fam_idx.flatten().tolist():
            self.acc["cand"][j] += 1
        if not len(fol):
            return
        fi = fam_idx.to(dev)
        rej = fol.extra["rejected"]
        self.acc["rejected"].index_add_(0, fi.flatten(), rej.flatten().double())
        ok = fol.chosen >= 0
        sel = fi.gather(1, fol.chosen.clamp_min(0).view(-1, 1)).view(-1)
        self.acc["chosen"].index_add_(0, sel, ok.double())
        if fol.scores is not None:
            s = fol.scores.double()
            finite = torch.isfinite(s)
            self.acc["score"].index_add_(0, fi.flatten(), torch.where(finite, s, 0).flatten())
            self.acc["nscore"].index_add_(0, fi.flatten(), finite.double().flatten())
            cs = s.gather(1, fol.chosen.clamp_min(0).view(-1, 1)).view(-1)
            self.acc["chosen_score"].index_add_(0, sel, torch.where(ok, cs, 0))
        self.acc["weights"] = wok.family_probs(rates).tolist() + [None] * (len(fams) - len(wok.families))

    def take(self, epoch: int, labels: Sequence[str]) -> list[dict[str, Any]]:
        """This rank's rows of ``epoch`` (one per family of ``labels``), and a fresh count."""
        if "cand" not in self.acc:
            return []
        a = {k: (v.cpu().tolist() if torch.is_tensor(v) else v) for k, v in self.acc.items()}
        rows = []
        for i, fam in enumerate(labels):
            rows.append(
                {
                    "epoch": epoch,
                    "family": fam,
                    "candidates": a["cand"][i],
                    "chosen": a["chosen"][i],
                    "rejected": a["rejected"][i],
                    "score": a["score"][i],
                    "nscore": a["nscore"][i],
                    "chosen_score": a["chosen_score"][i],
                    "weight": a.get("weights", [None] * 99)[i],
                }
            )
        self.acc = {}
        return rows


def merge_rows(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Sum the ranks' per-family rows; means from the sums."""
    out: dict[tuple[int, str], dict[str, Any]] = {}
    for r in rows:
        key = (r["epoch"], r["family"])
        if key not in out:
            out[key] = dict(r)
            continue
        for c in SUMMED:
            out[key][c] += r[c]
    merged = []
    for r in out.values():
        merged.append(
            {
                "epoch": r["epoch"],
                "family": r["family"],
                "candidates": int(r["candidates"]),
                "chosen": int(r["chosen"]),
                "rejected": int(r["rejected"]),
                "mean_score": round(r["score"] / r["nscore"], 6) if r["nscore"] else None,
                "mean_chosen_score": round(r["chosen_score"] / r["chosen"], 6)
                if r["chosen"] and r["nscore"]
                else None,
                "weight": None if r["weight"] is None else round(float(r["weight"]), 6),
            }
        )
    return merged


def with_epoch(
    stats: pd.DataFrame, merged: list[dict[str, Any]], epoch: int, columns: Sequence[str]
) -> pd.DataFrame:
    """``stats`` with the rows of ``epoch`` replaced by ``merged`` (a re-run epoch never duplicates)."""
    new = pd.DataFrame(merged, columns=list(columns))
    keep = stats[stats["epoch"] != epoch] if len(stats) else stats
    return pd.concat([keep, new], ignore_index=True) if len(keep) else new


def sample_rows(
    fol: Followups, ids: Sequence[Any] | None, step: int, epoch: int, rank: int, n: int
) -> list[dict[str, Any]]:
    """The recipes of the first ``n`` kept follow-ups of a step (``ids``: the batch's case ids, if known):
    rows of ``metamorphic_training_samples.jsonl``; any is re-created by
    :func:`~robusttrain.training.recreate_followup`."""
    rows = []
    for i in range(min(len(fol), n)):
        rec = fol.recipe(i)
        if rec is None:
            continue
        pos = int(fol.index[i])
        row = {
            "step": step,
            "epoch": epoch,
            "rank": rank,
            "position": pos,
            "case_id": None if ids is None else str(list(ids)[pos]),
            "family": rec["family"],
            "severity": int(rec["severity"]),
            "params": jsonable(rec.get("params", {})),
        }
        extra = {k: v for k, v in rec.items() if k not in ("family", "severity", "params")}
        if extra:  # a chain's operations and mix, AugMax's partner: recreate_followup(row["recipe"], ...)
            row["recipe"] = jsonable(rec)
        rows.append(row)
    return rows
