"""What metamorphic training drew and kept, per family and epoch: the counts behind
``metamorphic_training.csv`` and the rows of ``metamorphic_training_samples.jsonl``
(:mod:`robusttrain.rundir.metamorphic_training`), kept by one :class:`TrainingLedger`. No trainer here:
the callback feeds each step's follow-ups in, gathers the ranks' parts and writes the files.

>>> rows = [{"epoch": 0, "family": "blur", "candidates": 4, "chosen": 1, "rejected": 0, "score": 0.5,
...          "nscore": 4, "chosen_score": 0.2, "weight": 0.5}] * 2   # two ranks
>>> merge_rows(rows)[0]["candidates"], merge_rows(rows)[0]["mean_score"], merge_rows(rows)[0]["mean_chosen_score"]
(8, 0.125, 0.2)
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import Any, NamedTuple

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


# how the ranks' parts combine (TrainingLedger.combine; torchmetrics declares a reduction beside each state)
RANK_MERGE = {
    "counts": "summed per (epoch, family); means from the sums (merge_rows)",
    "samples": "concatenated, ordered by (step, rank, position)",
}


class TrainingLedger:
    """The run's record of metamorphic training: this epoch's per-family counts (:class:`FamilyCounts`) and
    sampled recipes on each rank; the run's merged ``stats`` (one row per epoch and family:
    ``metamorphic_training.csv``) and ``samples`` (``metamorphic_training_samples.jsonl``). Ranks combine
    as :data:`RANK_MERGE` says.

    Args:
        columns: the stats table's columns (:data:`robusttrain.rundir.metamorphic_training.STATS_COLUMNS`).

    >>> ledger = TrainingLedger(["epoch", "family", "candidates", "chosen", "rejected", "mean_score",
    ...                          "mean_chosen_score", "weight"])
    >>> row = {"epoch": 0, "family": "blur", "candidates": 4, "chosen": 1, "rejected": 0, "score": 0.5,
    ...        "nscore": 4, "chosen_score": 0.2, "weight": 0.5}
    >>> merged = ledger.combine([{"rows": [row], "samples": []}] * 2)   # two ranks' parts
    >>> kept_shares(merged.rows), ledger.update(0, merged)
    ({'mt/kept_share/blur': 1.0}, None)
    >>> ledger.stats[["family", "candidates", "chosen"]].values.tolist()
    [['blur', 8, 2]]
    >>> again = TrainingLedger(ledger.columns); again.load_state_dict(ledger.state_dict())
    >>> again.stats.equals(ledger.stats)
    True
    """

    def __init__(self, columns: Sequence[str]) -> None:
        self.columns = list(columns)
        self.stats = pd.DataFrame(columns=self.columns)
        self.samples: list[dict[str, Any]] = []
        self.counts = FamilyCounts()  # this epoch's, this rank's
        self._epoch_samples: list[dict[str, Any]] = []

    def add(self, wok: WorstOfK, fol: Followups, rates: Mapping[str, float] | None) -> None:
        """Count one step's follow-ups (:meth:`FamilyCounts.add`)."""
        self.counts.add(wok, fol, rates)

    def sample(
        self, fol: Followups, ids: Sequence[Any] | None, step: int, epoch: int, rank: int, n: int
    ) -> None:
        """Keep the recipes of one step's first ``n`` follow-ups (:func:`sample_rows`)."""
        self._epoch_samples.extend(sample_rows(fol, ids, step, epoch, rank, n))

    def take(self, epoch: int, labels: Sequence[str] | None) -> dict[str, list[dict[str, Any]]]:
        """This rank's part of ``epoch`` (its per-family rows over ``labels``, none before a sampler exists,
        and its sampled recipes) for the gather; both start afresh."""
        rows = self.counts.take(epoch, labels) if labels is not None else []
        part, self._epoch_samples = {"rows": rows, "samples": self._epoch_samples}, []
        return part

    @staticmethod
    def combine(parts: Iterable[Mapping[str, list[dict[str, Any]]]]) -> EpochRecord:
        """Every rank's :meth:`take` of one epoch as one record (the same on every rank)."""
        parts = list(parts)
        rows = merge_rows([r for p in parts for r in p["rows"]])
        samples = sorted(
            (s for p in parts for s in p["samples"]), key=lambda r: (r["step"], r["rank"], r["position"])
        )
        return EpochRecord(rows, samples)

    def update(self, epoch: int, record: EpochRecord) -> None:
        """Add one epoch's merged record (a re-run epoch replaces its stats rows)."""
        self.stats = with_epoch(self.stats, record.rows, epoch, self.columns)
        self.samples.extend(record.samples)

    def state_dict(self) -> dict[str, Any]:
        """The stats (column -> plain python list) and the samples."""
        return {
            "stats": {c: [_py(v) for v in self.stats[c].tolist()] for c in self.stats.columns},
            "samples": list(self.samples),
        }

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        stats = state.get("stats") or {}
        self.stats = (
            pd.DataFrame(stats, columns=self.columns) if stats else pd.DataFrame(columns=self.columns)
        )
        self.samples = list(state.get("samples", []))


class EpochRecord(NamedTuple):
    """One epoch of metamorphic training over every rank: the merged per-family rows and the sampled recipes."""

    rows: list[dict[str, Any]]
    samples: list[dict[str, Any]]


def kept_shares(rows: Sequence[Mapping[str, Any]]) -> dict[str, float]:
    """``mt/kept_share/<family>``: each family's share of the follow-ups kept (empty when none was)."""
    kept = sum(r["chosen"] for r in rows)
    return {f"mt/kept_share/{r['family']}": r["chosen"] / kept for r in rows} if kept else {}


def _py(v: Any) -> Any:
    return v.item() if hasattr(v, "item") else v
