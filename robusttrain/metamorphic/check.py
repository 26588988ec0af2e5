"""The MR check as one library call: which cases, in which state, predicted how, sharded, gathered.

Both the training-time check (:class:`robusttrain.callbacks.MetamorphicCallback`, a thin adapter
for hooks, clock, state and files) and the standalone audit (:func:`robusttrain.metamorphic.audit.audit`,
``python -m robusttrain check``) go through here, so the audit of a checkpoint reproduces the numbers
the check wrote while it trained (same case subset, same seeded state, same follow-up params, same
scoring):

* :func:`probe_cases` -- the seeded subset of whole cases (planted hard cases first);
* :func:`checking_state` -- eval mode, no gradients, RNGs seeded by the suite's seed (anything random in
  a dataset's ``__getitem__`` replays), every mode and RNG state restored after;
* :func:`predict_fn` -- ``predict(images) -> probabilities`` under a forward context (autocast);
* :func:`run_check` -- per split: the selected follow-ups (a budget's plan or all), this rank's shard,
  :func:`~robusttrain.metamorphic.runner.run_probe`, the ranks' results gathered and merged.

>>> import torch
>>> from robusttrain.metamorphic.suite import MRSuite
>>> ds = [(torch.rand(3, 16, 16), (torch.rand(16, 16) > 0.5).long()) for _ in range(4)]
>>> model = torch.nn.Conv2d(3, 2, 1)
>>> idx, ids = probe_cases(ds, "val", max_cases=3, seed=0)
>>> len(idx), ids[:1]
(3, ['idx0'])
>>> with checking_state(model, seed=0):
...     res = run_check(predict_fn(model), {"val": Probe(ds, idx, ids)}, MRSuite(["contrast"], (2,)))
...     was_eval = not model.training
>>> res["val"].src.shape[0], was_eval, model.training   # 3 cases scored in eval mode, train mode restored
(3, True, True)
"""

from __future__ import annotations

import contextlib
import random
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

import numpy as np
import torch

from robusttrain.checkpoints import rng_state, set_rng_state

from .batch import BatchHooks, HookError, case_ids_of, iter_probe
from .outputs import to_probabilities_fn
from .runner import ProbeResult, run_probe
from .suite import MRSuite, stable_seed


@dataclass
class Probe:
    """One split of a check: the dataset, the probe's dataset indices and their case ids.

    ``plan``: per test index, the case ids to score under it (a budget's plan), None = every test on
    every case. ``id_prefix`` names samples without case ids (``idx5``; ``train/idx5`` in a train probe).
    ``clean(batch) -> (labels, classes) | None``: clean labels already computed for these very inputs and
    weights (the training-time check reuses the validation loop's forwards), None: forward them.
    """

    dataset: Any
    indices: list[int]
    case_ids: list[str]
    plan: Mapping[int, set[str]] | None = None
    id_prefix: str = "idx"
    clean: Callable[[Any], tuple[torch.Tensor, int] | None] | None = None


def id_prefix(split: str) -> str:
    """How samples without case ids are named: ``idx5`` in validation, ``train/idx5`` in a train probe."""
    return "idx" if split == "val" else f"{split}/idx"


def probe_cases(
    dataset: Any, split: str, max_cases: int | None, seed: int, always: Sequence[str] = ()
) -> tuple[list[int], list[str]]:
    """Dataset indices and case ids of the probe: a seeded subset of ``max_cases`` whole cases.

    Cases in ``always`` (planted hard cases) are kept first; the rest are a seeded draw, so the probe
    is the same in every epoch, process, resume and audit. ``max_cases=None``: every case.
    """
    ids = case_ids_of(dataset) or [f"{id_prefix(split)}{i}" for i in range(len(dataset))]
    idx = select_probe(ids, max_cases, seed, split, always)
    return idx, [ids[i] for i in idx]


def select_probe(
    case_ids: Sequence[str], max_cases: int | None, seed: int, split: str, always: Sequence[str] = ()
) -> list[int]:
    """Indices of a seeded subset of ``max_cases`` whole cases (all when None); see :func:`probe_cases`.

    >>> select_probe(["a", "a", "b", "c"], max_cases=2, seed=0, split="val", always=["c"])  # c + one draw
    [2, 3]
    """
    cases = list(dict.fromkeys(case_ids))
    if max_cases is not None and 0 <= max_cases < len(cases):
        keep = [c for c in cases if c in set(always)][:max_cases]
        rest = [c for c in cases if c not in set(keep)]
        rng = np.random.default_rng(stable_seed(seed, split, "probe"))
        pick: np.ndarray | list[int] = (
            rng.choice(len(rest), size=max_cases - len(keep), replace=False) if max_cases > len(keep) else []
        )
        chosen = set(keep) | {rest[int(i)] for i in pick}
    else:
        chosen = set(cases)
    return [i for i, c in enumerate(case_ids) if c in chosen]


@contextlib.contextmanager
def eval_state(model: torch.nn.Module) -> Iterator[None]:
    """Eval mode and no_grad; every module's own mode and every RNG stream (torch, CUDA, numpy, random)
    put back after the block (a frozen submodule stays in eval; BatchNorm statistics are not updated)."""
    modes = [(m, m.training) for m in model.modules()]
    try:
        with rng_preserved():
            model.eval()
            with torch.no_grad():
                yield
    finally:
        for m, was in modes:
            m.training = was


@contextlib.contextmanager
def checking_state(model: torch.nn.Module, seed: int) -> Iterator[None]:
    """:func:`eval_state` with the RNGs seeded by ``seed`` inside it."""
    with eval_state(model):
        # seeding makes anything random in the datasets' __getitem__ replay each epoch (and in the audit)
        torch.manual_seed(seed)
        np.random.seed(seed % 2**32)
        random.seed(seed)
        yield


def predict_fn(
    model: Callable[[torch.Tensor], Any],
    to_probabilities: str | Callable | None = None,
    forward_context: Callable[[], Any] | None = None,
) -> Callable[[torch.Tensor], torch.Tensor]:
    """``predict(images) -> (B,K,...) float probabilities``; ``to_probabilities`` as the hooks take it
    (a string choice or a callable), ``forward_context`` e.g. Lightning's precision plugin's."""
    convert = to_probabilities if callable(to_probabilities) else to_probabilities_fn(to_probabilities)
    ctx = forward_context or contextlib.nullcontext

    def predict(images: torch.Tensor) -> torch.Tensor:
        with ctx():
            out = model(images)
        probs = convert(out)
        if (
            not torch.is_tensor(probs)
            or probs.ndim != images.ndim
            or probs.shape[0] != images.shape[0]
            or probs.shape[2:] != images.shape[2:]
        ):
            want = "(B,K,H,W,D)" if images.ndim == 5 else "(B,K,H,W)"
            raise HookError(
                f"to_probabilities must return {want} matching the images {tuple(images.shape)}, "
                f"got {getattr(probs, 'shape', type(probs).__name__)}; fix to_probabilities="
            )
        return probs.float()

    return predict


def to_indices(
    plan: Mapping[int, set[str]] | None, indices: Sequence[int], case_ids: Sequence[str]
) -> dict[int, set[int]] | None:
    """A per-test set of case ids -> the dataset indices (every slice of each case).

    >>> to_indices({0: {"a"}, 1: {"b"}}, [10, 11, 12], ["a", "a", "b"])
    {0: {10, 11}, 1: {12}}
    """
    if plan is None:
        return None
    return {k: {int(i) for i, c in zip(indices, case_ids) if c in cases} for k, cases in plan.items()}


@contextlib.contextmanager
def rng_preserved() -> Iterator[None]:
    """Every RNG stream put back after the block (:func:`robusttrain.checkpoints.rng_state`)."""
    state = rng_state()
    try:
        yield
    finally:
        set_rng_state(state)


def prepare_suite(suite: MRSuite, probe: Probe, hooks: BatchHooks) -> None:
    """Fit ``suite`` to the data's channel count, reading one sample without moving any RNG stream
    (a dataset drawing from the global RNG then reads the same in the first check, a later one and an
    audit)."""
    with rng_preserved():
        pb = next(iter_probe(probe.dataset, probe.indices[:1], 1, hooks, id_prefix=probe.id_prefix))
    suite.prepare(pb.images.shape[1], probe=pb.images)


class ProgressBar(Protocol):
    """What :func:`run_check` uses of the bar ``progress`` returns (tqdm's interface)."""

    def update(self, n: int) -> object: ...

    def close(self) -> object: ...


class ImageCount:
    """A progress bar counting images while the runner reports forwards: ``forwarded(n)`` moves the bar by
    the whole images ``n`` more forwards complete (``forwards / images`` forwards per image).

    >>> class Bar:
    ...     n = 0
    ...     def update(self, k): self.n += k
    >>> bar = Bar(); count = ImageCount(bar, images=4, forwards=12)
    >>> for _ in range(5): count.forwarded(2)
    >>> bar.n    # 10 of 12 forwards: 3 of 4 images
    3
    """

    def __init__(self, bar: ProgressBar, images: int, forwards: int):
        self.bar, self.images, self.per = bar, images, max(1.0, forwards / max(1, images))
        self.done, self.shown = 0, 0

    def forwarded(self, n: int) -> None:
        self.done += int(n)
        now = min(self.images, int(self.done / self.per + 1e-9))
        if now > self.shown:
            self.bar.update(now - self.shown)
            self.shown = now


def run_check(
    predict: Callable[[torch.Tensor], torch.Tensor],
    probes: Mapping[str, Probe],
    suite: MRSuite,
    *,
    path: str = "torch",
    device: torch.device | str | None = None,
    batch_size: int = 8,
    num_workers: int = 0,
    hooks: BatchHooks | None = None,
    epoch: int | None = None,
    rank: int = 0,
    world_size: int = 1,
    gather: Callable[[Any], list[Any]] | None = None,
    progress: Callable[[str, int], ProgressBar] | None = None,
) -> dict[str, ProbeResult]:
    """Score every probe (split) under ``suite``; call inside :func:`checking_state`.

    Each rank scores its shard (``indices[rank::world_size]``); ``gather(obj) -> [every rank's obj]``
    (a collective; default: this process only) brings the shards together, so every rank returns the
    same merged results. A probe's ``plan`` limits the follow-ups; a train probe (split != "val") then
    also limits its clean pass to the planned cases. ``progress(split, total)`` returns a progress bar
    (:class:`ProgressBar`: ``update(n)`` per sample, ``close()`` when the split is done).
    """
    hooks = hooks or BatchHooks()
    gather = gather or (lambda obj: [obj])
    if suite.in_channels is None:  # the same suite on every rank, even on empty shards
        first = next((p for p in probes.values() if p.indices), None)
        if first is not None:
            prepare_suite(suite, first, hooks)
    out: dict[str, ProbeResult] = {}
    for split, p in probes.items():
        sel = to_indices(p.plan, p.indices, p.case_ids)
        idx = list(p.indices)
        if sel is not None and split != "val":
            keep = set().union(*sel.values())
            idx = [i for i in idx if i in keep]
        shard = idx[rank :: max(1, world_size)]
        n_fol = (
            len(shard) * len(suite.tests) if sel is None else sum(len(set(shard) & s) for s in sel.values())
        )
        bar = progress(split, len(shard)) if progress is not None else None
        batches = iter_probe(p.dataset, shard, batch_size, hooks, num_workers, p.id_prefix)
        res = run_probe(
            predict,
            batches,
            suite,
            split,
            path=path,
            device=device,
            progress=None if bar is None else ImageCount(bar, len(shard), len(shard) + n_fol).forwarded,
            epoch=epoch,
            selection=sel,
            clean=p.clean,
        )
        if bar is not None:
            bar.close()
        out[split] = ProbeResult.merge([ProbeResult(**part) for part in gather(res.to_obj())])
    return out
