"""Running the suite on probe batches (per-slice sums) and aggregating them per case.

``run_probe`` needs only ``predict(images) -> (B,K,H,W) probabilities``. Its result holds
integer sums per *slice*, keyed by dataset index, so results of several ranks merge by
concatenation + de-duplication (:meth:`ProbeResult.merge`) before cases are aggregated.

>>> import torch
>>> from robusttrain.metamorphic.batch import ProbeBatch
>>> from robusttrain.metamorphic.suite import MRSuite
>>> suite = MRSuite(["blur"], severities=(2,)); suite.prepare(3)
>>> pb = ProbeBatch([0], torch.rand(1, 3, 32, 32), torch.ones(1, 32, 32, dtype=torch.long), ["c"], [0])
>>> predict = lambda x: torch.cat([1 - x[:, :1], x[:, :1]], 1)
>>> res = run_probe(predict, [pb], suite, "val", path="torch")
>>> hist, cases = aggregate(res, ["fg"], epoch=0, suite=suite)
>>> list(cases.columns[:6])
['epoch', 'split', 'case_id', 'perturbation', 'severity', 'seed']
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable, Iterable, Sequence

import numpy as np
import pandas as pd
import torch

from .batch import ProbeBatch
from .efr import relative_drops
from .outputs import NonFiniteOutputError, check_probabilities
from .scoring import dice_from_sums, iou_from_sums, probabilities_to_labels, slice_sums
from .suite import MRSuite, to_uint8_list

Predict = Callable[[torch.Tensor], torch.Tensor]


@dataclass
class ProbeResult:
    """Per-slice integer sums: ``src`` (N,Kf,3), ``fol`` / ``cons`` (N,T,Kf,3)."""

    split: str
    index: np.ndarray
    case_id: list[str]
    slice_index: np.ndarray
    src: np.ndarray
    fol: np.ndarray
    cons: np.ndarray
    extra: dict = field(default_factory=dict)

    def to_obj(self) -> dict:
        return self.__dict__.copy()

    @classmethod
    def merge(cls, parts: Sequence["ProbeResult"]) -> "ProbeResult":
        """Concatenate (e.g. gathered from ranks), drop duplicate indices, sort by index."""
        parts = [p for p in parts if len(p.index)] or list(parts[:1])
        idx = np.concatenate([p.index for p in parts])
        _, first = np.unique(idx, return_index=True)  # sorted unique indices, first occurrence
        cat = lambda name: np.concatenate([getattr(p, name) for p in parts])[first]
        cids = sum((list(p.case_id) for p in parts), [])
        return cls(parts[0].split, idx[first], [cids[i] for i in first], cat("slice_index"),
                   cat("src"), cat("fol"), cat("cons"))


def run_probe(predict: Predict, batches: Iterable[ProbeBatch], suite: MRSuite, split: str,
              path: str = "torch", device: torch.device | str | None = None,
              progress: Callable[[int], None] | None = None, epoch: int | None = None) -> ProbeResult:
    """Score every probe slice clean and under every test of ``suite``.

    NaN/inf outputs raise :class:`NonFiniteOutputError` naming ``epoch``, ``split`` and the cases.
    """
    idx, cids, sl, src, fol, cons = [], [], [], [], [], []
    where: dict = {}
    predict = _checked(predict, where, epoch, split)
    for pb in batches:
        where["case_ids"] = pb.case_ids
        images = pb.images if device is None else pb.images.to(device)
        masks = pb.masks.to(images.device)
        if suite.in_channels is None:
            suite.prepare(images.shape[1], probe=pb.images[:1].float().cpu())
        probs = predict(images)
        src_lab = probabilities_to_labels(probs)
        # K from the probability channels (1 channel = binary): a batch's label range would
        # under-count classes that neither the model nor this batch's masks contain
        k_classes = max(2, int(probs.shape[1]))
        src.append(slice_sums(src_lab, masks, k_classes).cpu())
        f_rows, c_rows = [], []
        u8 = to_uint8_list(pb.images) if path == "numpy" else None  # once per batch, not per test
        for k in range(len(suite.tests)):
            params = suite.params_for(split, k, pb.case_ids, pb.slice_indices, pb.images, pb.masks)
            fimg = suite.apply(k, images, masks, params, path=path, uint8=u8)
            flab = probabilities_to_labels(predict(fimg))
            f_rows.append(slice_sums(flab, masks, k_classes).cpu())
            c_rows.append(slice_sums(flab, src_lab, k_classes).cpu())
            if progress:
                progress(1)
        if progress:
            progress(1)
        fol.append(torch.stack(f_rows, 1) if f_rows else torch.zeros(len(pb.indices), 0, k_classes - 1, 3))
        cons.append(torch.stack(c_rows, 1) if c_rows else torch.zeros(len(pb.indices), 0, k_classes - 1, 3))
        idx += pb.indices
        cids += pb.case_ids
        sl += pb.slice_indices
    if not idx:
        z = np.zeros((0, 1, 3), np.int64)
        return ProbeResult(split, np.zeros(0, np.int64), [], np.zeros(0, np.int64), z,
                           np.zeros((0, len(suite.tests), 1, 3), np.int64),
                           np.zeros((0, len(suite.tests), 1, 3), np.int64))
    kf = max(t.shape[1] for t in src)  # class count is fixed by the model's output channels
    pad = lambda t: torch.nn.functional.pad(t, (0, 0, 0, kf - t.shape[-2])) if t.shape[-2] < kf else t
    return ProbeResult(split, np.asarray(idx, np.int64), cids, np.asarray(sl, np.int64),
                       torch.cat([pad(t) for t in src]).numpy(), torch.cat([pad(t) for t in fol]).numpy(),
                       torch.cat([pad(t) for t in cons]).numpy())


def _checked(predict: Predict, where: dict, epoch: int | None, split: str) -> Predict:
    """``predict`` whose NaN/inf outputs stop the check with the epoch, split and cases named."""
    def run(images: torch.Tensor) -> torch.Tensor:
        try:
            probs = predict(images)
            check_probabilities(probs)
        except NonFiniteOutputError as e:
            raise e.at(epoch, split, where.get("case_ids", ())) from None
        return probs
    return run


def case_order(res: ProbeResult) -> list[str]:
    """Case ids by their first dataset index (deterministic across ranks and paths)."""
    return list(dict.fromkeys(res.case_id))


def _case_sums(res: ProbeResult, arr: np.ndarray) -> dict[str, np.ndarray]:
    out: dict[str, np.ndarray] = {}
    for cid, a in zip(res.case_id, arr):
        out[cid] = out[cid] + a if cid in out else a.copy()
    return out


def aggregate(res: ProbeResult, class_names: Sequence[str], epoch: int,
              suite: MRSuite) -> tuple[pd.DataFrame, pd.DataFrame]:
    """(history rows: clean per-class Dice/IoU per case; test-case rows for mr_cases.csv)."""
    names = list(class_names)[: res.src.shape[1]]
    names += [f"class{i + 1}" for i in range(len(names), res.src.shape[1])]
    src = _case_sums(res, res.src)
    fol = _case_sums(res, res.fol)
    cons = _case_sums(res, res.cons)
    hist, rows = [], []
    for cid in case_order(res):
        d, j = dice_from_sums(src[cid]), iou_from_sums(src[cid])
        hist.append({"case_id": cid, "epoch": int(epoch), **{f"dice_{n}": float(v) for n, v in zip(names, d)},
                     **{f"iou_{n}": float(v) for n, v in zip(names, j)}})
        for k, (pname, sev) in enumerate(suite.tests):
            fd, fj = dice_from_sums(fol[cid][k]), iou_from_sums(fol[cid][k])
            rows.append({"epoch": int(epoch), "split": res.split, "case_id": cid,
                         "perturbation": pname, "severity": int(sev),
                         "seed": suite.case_seed(cid, k),
                         "src_dice": float(d.mean()), "fol_dice": float(fd.mean()),
                         "src_iou": float(j.mean()), "fol_iou": float(fj.mean()),
                         "consistency": float(dice_from_sums(cons[cid][k]).mean())})
    cases = pd.DataFrame(rows, columns=CASE_COLUMNS)
    if len(cases):
        cases["drop_dice"] = relative_drops(cases["src_dice"], cases["fol_dice"])
        cases["drop_iou"] = relative_drops(cases["src_iou"], cases["fol_iou"])
    return pd.DataFrame(hist), cases


CASE_COLUMNS = ["epoch", "split", "case_id", "perturbation", "severity", "seed", "src_dice",
                "fol_dice", "src_iou", "fol_iou", "consistency"]


def worst_slice(res: ProbeResult, case_id: str, k: int) -> int:
    """Row of ``res`` (a slice of ``case_id``) whose Dice dropped most under test ``k``."""
    rows = [i for i, c in enumerate(res.case_id) if c == case_id]
    drop = [float(dice_from_sums(res.src[i]).mean() - dice_from_sums(res.fol[i, k]).mean()) for i in rows]
    return rows[int(np.argmax(drop))]
