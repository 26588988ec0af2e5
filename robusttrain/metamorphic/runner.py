"""Running the suite on probe batches (per-slice sums) and aggregating them per case.

``run_probe`` needs only ``predict(images) -> (B,K,H,W) probabilities`` ((B,K,H,W,D) for
volumes). Its result holds integer sums per *slice* (per volume for 3-D data), keyed by dataset
index, so results of several ranks merge by concatenation + de-duplication
(:meth:`ProbeResult.merge`) before cases are aggregated. ``selection`` restricts the follow-ups
to some (sample, test) pairs (a budgeted check, :mod:`.budget`); the clean pass always covers
every probe sample, and ``tested`` records which pairs were scored.

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

import time
from collections.abc import Callable, Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pandas as pd
import torch

from .batch import ProbeBatch
from .outputs import NonFiniteOutputError, check_probabilities
from .records import relative_drops
from .scoring import dice_from_sums, iou_from_sums, probabilities_to_labels, slice_sums
from .suite import MRSuite, to_uint8_list, volume_to_slices

Predict = Callable[[torch.Tensor], torch.Tensor]
Selection = Mapping[int, Collection[int]]  # test index -> dataset indices scored under it


@dataclass
class ProbeResult:
    """Per-slice integer sums: ``src`` (N,Kf,3), ``fol`` / ``cons`` (N,T,Kf,3).

    ``tested`` (N,T) bool: which follow-ups were scored (None: all); ``extra["timing"]``: seconds
    and sample counts of the clean and follow-up passes (what a budget plans the next check with).
    """

    split: str
    index: np.ndarray
    case_id: list[str]
    slice_index: np.ndarray
    src: np.ndarray
    fol: np.ndarray
    cons: np.ndarray
    extra: dict = field(default_factory=dict)
    tested: np.ndarray | None = None

    def to_obj(self) -> dict:
        return self.__dict__.copy()

    @property
    def tested_mask(self) -> np.ndarray:
        return np.ones(self.fol.shape[:2], bool) if self.tested is None else np.asarray(self.tested, bool)

    @classmethod
    def merge(cls, parts: Sequence[ProbeResult]) -> ProbeResult:
        """Concatenate (e.g. gathered from ranks), drop duplicate indices, sort by index."""
        timing = _sum_timing(p.extra.get("timing") for p in parts)
        parts = [p for p in parts if len(p.index)] or list(parts[:1])
        idx = np.concatenate([p.index for p in parts])
        _, first = np.unique(idx, return_index=True)  # sorted unique indices, first occurrence
        cat = lambda name: np.concatenate([getattr(p, name) for p in parts])[first]
        cids = sum((list(p.case_id) for p in parts), [])
        tested = np.concatenate([p.tested_mask for p in parts])[first]
        return cls(
            parts[0].split,
            idx[first],
            [cids[i] for i in first],
            cat("slice_index"),
            cat("src"),
            cat("fol"),
            cat("cons"),
            {"timing": timing} if timing else {},
            tested,
        )


def _sum_timing(items: Iterable[dict | None]) -> dict:
    # ranks run in parallel: the slowest rank's seconds, the sum of samples (per-sample cost
    # then reads as wall time per sample of the whole check)
    ts = [t for t in items if t]
    if not ts:
        return {}
    return {
        "clean_s": max(t["clean_s"] for t in ts),
        "followup_s": max(t["followup_s"] for t in ts),
        "n_clean": sum(t["n_clean"] for t in ts),
        "n_followup": sum(t["n_followup"] for t in ts),
        "n_reused": sum(t.get("n_reused", 0) for t in ts),
    }


class _Followups:
    """Follow-up images waiting for a forward pass, so sparse (budgeted) tests still run in full batches."""

    def __init__(self, predict: Predict, size: int, progress: Callable[[int], object] | None, where: dict):
        self.predict, self.size, self.progress, self.where = predict, max(1, int(size)), progress, where
        self.items: list[tuple] = []
        self.n = 0

    def add(self, item: tuple) -> None:  # (block, rows, k, images, masks, source labels)
        self.items.append(item)
        self.n += item[3].shape[0]
        if self.n >= self.size:
            self.flush()

    def flush(self) -> None:
        if not self.items:
            return
        # the cases of these follow-ups (they may come from earlier probe batches) name a NaN's origin
        self.where["case_ids"] = list(
            dict.fromkeys(it[0]["pb"].case_ids[r] for it in self.items for r in it[1])
        )
        labels = probabilities_to_labels(self.predict(torch.cat([it[3] for it in self.items])))
        start = 0
        for block, rows, k, imgs, masks, src_lab in self.items:
            lab = labels[start : start + imgs.shape[0]]
            start += imgs.shape[0]
            kc = block["k_classes"]
            block["fol"][rows, k] = slice_sums(lab, masks, kc).cpu().numpy()
            block["cons"][rows, k] = slice_sums(lab, src_lab, kc).cpu().numpy()
            block["tested"][rows, k] = True
        if self.progress:
            self.progress(self.n)
        self.items, self.n = [], 0


def run_probe(
    predict: Predict,
    batches: Iterable[ProbeBatch],
    suite: MRSuite,
    split: str,
    path: str = "torch",
    device: torch.device | str | None = None,
    progress: Callable[[int], object] | None = None,
    epoch: int | None = None,
    selection: Selection | None = None,
    forward_batch: int | None = None,
    clean: Callable[[ProbeBatch], tuple[torch.Tensor, int] | None] | None = None,
) -> ProbeResult:
    """Score every probe slice clean, and under every test of ``suite`` (or the ``selection``).

    ``progress(n)`` is called with the number of samples forwarded; ``forward_batch``: follow-ups
    per forward pass (default: the probe batch size). NaN/inf outputs raise
    :class:`NonFiniteOutputError` naming ``epoch``, ``split`` and the cases. ``clean(batch)``: the
    batch's clean labels and class count when already known (the validation loop's own forward of the
    very same inputs and weights), else None: then the clean pass forwards the batch itself.
    """
    blocks: list[dict] = []
    queue: _Followups | None = None
    t_clean = t_fol = 0.0
    n_clean = n_fol = n_reused = 0
    where: dict = {}
    predict = _checked(predict, where, epoch, split)
    for pb in batches:
        t0 = time.perf_counter()
        images = pb.images if device is None else pb.images.to(device)
        masks = pb.masks.to(images.device)
        if suite.in_channels is None:
            suite.prepare(images.shape[1], probe=pb.images[:1].float().cpu())
        n_tests = len(suite.tests)
        if queue is None:
            queue = _Followups(predict, forward_batch or len(pb.indices), progress, where)
        where["case_ids"] = pb.case_ids
        known = clean(pb) if clean is not None else None
        if known is not None:
            src_lab, k_classes = known[0].to(images.device), int(known[1])
            n_reused += len(pb.indices)
        else:
            probs = predict(images)
            src_lab = probabilities_to_labels(probs)
            # K from the probability channels (1 channel = binary): a batch's label range would
            # under-count classes that neither the model nor this batch's masks contain
            k_classes = max(2, int(probs.shape[1]))
        n = len(pb.indices)
        block = {
            "pb": pb,
            "k_classes": k_classes,
            "src": slice_sums(src_lab, masks, k_classes).cpu().numpy(),
            "fol": np.zeros((n, n_tests, k_classes - 1, 3), np.int64),
            "cons": np.zeros((n, n_tests, k_classes - 1, 3), np.int64),
            "tested": np.zeros((n, n_tests), bool),
        }
        blocks.append(block)
        if progress:
            progress(n)
        t1 = time.perf_counter()
        t_clean, n_clean = t_clean + t1 - t0, n_clean + n
        u8 = None
        by_family: dict[str, list[tuple[int, list[int], Any, list[dict]]]] = {}
        for k in range(n_tests):
            rows = (
                list(range(n))
                if selection is None
                else [i for i, j in enumerate(pb.indices) if j in selection.get(k, ())]
            )
            if not rows:
                continue
            if path == "numpy" and u8 is None:  # once per batch, not per test
                u8 = to_uint8_list(
                    volume_to_slices(pb.images, suite.slice_axis) if pb.images.ndim == 5 else pb.images
                )
            sub = rows if len(rows) < n else slice(None)
            params = suite.params_for(
                split,
                k,
                [pb.case_ids[i] for i in rows],
                [pb.slice_indices[i] for i in rows],
                pb.images[sub],
                pb.masks[sub],
            )
            if path == "torch" and images.ndim == 4:  # applied below, one call per family
                by_family.setdefault(suite.tests[k][0], []).append((k, rows, sub, params))
                continue
            per = len(u8) // n if u8 is not None else 1  # uint8 slices per sample (volumes: S)
            sub_u8 = None if u8 is None else [u8[i * per + j] for i in rows for j in range(per)]
            fimg = suite.apply(k, images[sub], masks[sub], params, path=path, uint8=sub_u8)
            queue.add((block, rows, k, fimg, masks[sub], src_lab[sub]))
            n_fol += len(rows)
        for tests in by_family.values():
            outs = suite.apply_family(
                [k for k, _, _, _ in tests],
                [images[sub] for _, _, sub, _ in tests],
                [masks[sub] for _, _, sub, _ in tests],
                [params for _, _, _, params in tests],
            )
            for (k, rows, sub, _), fimg in zip(tests, outs):
                queue.add((block, rows, k, fimg, masks[sub], src_lab[sub]))
                n_fol += len(rows)
        t_fol += time.perf_counter() - t1
    if queue is not None:
        t2 = time.perf_counter()
        queue.flush()
        t_fol += time.perf_counter() - t2
    timing = {
        "clean_s": t_clean,
        "followup_s": t_fol,
        "n_clean": n_clean,
        "n_followup": n_fol,
        "n_reused": n_reused,
    }
    n_tests = len(suite.tests)
    if not blocks:
        z = np.zeros((0, 1, 3), np.int64)
        return ProbeResult(
            split,
            np.zeros(0, np.int64),
            [],
            np.zeros(0, np.int64),
            z,
            np.zeros((0, n_tests, 1, 3), np.int64),
            np.zeros((0, n_tests, 1, 3), np.int64),
            {"timing": timing},
            np.zeros((0, n_tests), bool),
        )
    kf = max(b["src"].shape[1] for b in blocks)  # class count is fixed by the model's output channels
    pad = lambda a: np.pad(a, [(0, 0)] * (a.ndim - 2) + [(0, kf - a.shape[-2]), (0, 0)])
    cat = lambda name: np.concatenate([pad(b[name]) for b in blocks])
    pbs = [b["pb"] for b in blocks]
    return ProbeResult(
        split,
        np.asarray(sum((p.indices for p in pbs), []), np.int64),
        sum((list(p.case_ids) for p in pbs), []),
        np.asarray(sum((list(p.slice_indices) for p in pbs), []), np.int64),
        cat("src"),
        cat("fol"),
        cat("cons"),
        {"timing": timing},
        np.concatenate([b["tested"] for b in blocks]),
    )


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


def aggregate(
    res: ProbeResult, class_names: Sequence[str], epoch: int, suite: MRSuite
) -> tuple[pd.DataFrame, pd.DataFrame]:
    """(history rows: clean per-class Dice/IoU per case; test-case rows for mr_cases.csv).

    Test-case rows only for the (case, test) pairs scored on every slice of the case.
    """
    names = list(class_names)[: res.src.shape[1]]
    names += [f"class{i + 1}" for i in range(len(names), res.src.shape[1])]
    src = _case_sums(res, res.src)
    fol = _case_sums(res, res.fol)
    cons = _case_sums(res, res.cons)
    tested: dict[str, np.ndarray] = {}
    for cid, t in zip(res.case_id, res.tested_mask):
        tested[cid] = tested[cid] & t if cid in tested else t.copy()
    hist, rows = [], []
    for cid in case_order(res):
        d, j = dice_from_sums(src[cid]), iou_from_sums(src[cid])
        hist.append(
            {
                "case_id": cid,
                "epoch": int(epoch),
                **{f"dice_{n}": float(v) for n, v in zip(names, d)},
                **{f"iou_{n}": float(v) for n, v in zip(names, j)},
            }
        )
        for k, (pname, sev) in enumerate(suite.tests):
            if not tested[cid][k]:
                continue
            fd, fj = dice_from_sums(fol[cid][k]), iou_from_sums(fol[cid][k])
            rows.append(
                {
                    "epoch": int(epoch),
                    "split": res.split,
                    "case_id": cid,
                    "perturbation": pname,
                    "severity": int(sev),
                    "seed": suite.case_seed(cid, k),
                    "src_dice": float(d.mean()),
                    "fol_dice": float(fd.mean()),
                    "src_iou": float(j.mean()),
                    "fol_iou": float(fj.mean()),
                    "consistency": float(dice_from_sums(cons[cid][k]).mean()),
                }
            )
    cases = pd.DataFrame(rows, columns=CASE_COLUMNS)
    if len(cases):
        cases["drop_dice"] = relative_drops(cases["src_dice"], cases["fol_dice"])
        cases["drop_iou"] = relative_drops(cases["src_iou"], cases["fol_iou"])
    return pd.DataFrame(hist), cases


CASE_COLUMNS = [
    "epoch",
    "split",
    "case_id",
    "perturbation",
    "severity",
    "seed",
    "src_dice",
    "fol_dice",
    "src_iou",
    "fol_iou",
    "consistency",
]


def worst_slice(res: ProbeResult, case_id: str, k: int) -> int:
    """Row of ``res`` (a slice of ``case_id``) whose Dice dropped most under test ``k``."""
    rows = [i for i, c in enumerate(res.case_id) if c == case_id and res.tested_mask[i, k]]
    drop = [float(dice_from_sums(res.src[i]).mean() - dice_from_sums(res.fol[i, k]).mean()) for i in rows]
    return rows[int(np.argmax(drop))]
