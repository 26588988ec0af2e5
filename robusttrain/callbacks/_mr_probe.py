"""Helpers of MetamorphicCallback: probe selection, prediction, state save/restore, progress.

>>> select_probe(["a", "a", "b", "c"], max_cases=2, seed=0, split="val", always=["c"])  # c + one seeded draw
[2, 3]
"""
from __future__ import annotations

import contextlib
import random
import sys
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import numpy as np
import torch

from robusttrain.metamorphic.batch import HookError, iter_probe
from robusttrain.metamorphic.outputs import NonFiniteOutputError, to_probabilities_fn
from robusttrain.metamorphic.suite import stable_seed


def select_probe(case_ids: Sequence[str], max_cases: int | None, seed: int, split: str,
                 always: Sequence[str] = ()) -> list[int]:
    """Dataset indices of a seeded subset of ``max_cases`` whole cases (all when None).

    Cases in ``always`` (planted hard cases) are kept first; the rest are a seeded draw,
    so the probe is the same in every epoch, process and resume.
    """
    cases = list(dict.fromkeys(case_ids))
    if max_cases is not None and 0 <= max_cases < len(cases):
        keep = [c for c in cases if c in set(always)][:max_cases]
        rest = [c for c in cases if c not in set(keep)]
        rng = np.random.default_rng(stable_seed(seed, split, "probe"))
        pick = rng.choice(len(rest), size=max_cases - len(keep), replace=False) if max_cases > len(keep) else []
        chosen = set(keep) | {rest[int(i)] for i in pick}
    else:
        chosen = set(cases)
    return [i for i, c in enumerate(case_ids) if c in chosen]


def make_to_probabilities(spec: str | Callable | None) -> Callable:
    """The callback's ``to_probabilities=``: None/"auto", "logits", "identity" or a callable
    (see :mod:`robusttrain.metamorphic.outputs`); a bad value raises at construction."""
    return to_probabilities_fn(spec)


# logits tensor, dict with logits, or tuple; refuses NaN/inf and outputs that are probabilities
default_to_probabilities = to_probabilities_fn(None)


def decide_outputs(trainer: Any, pl_module: Any, dataset: Any, hooks: Any, to_probabilities: Callable,
                   batch_size: int = 2) -> str | None:
    """Before training: show ``to_probabilities="auto"`` the model's outputs on the first validation
    samples, so outputs that are unambiguously probabilities stop ``fit`` now, not after an epoch
    (:meth:`~robusttrain.metamorphic.outputs.AutoProbabilities.decide`). Other converters, or no
    dataset: nothing to decide (None). No RNG stream or module mode changes.
    """
    decide = getattr(to_probabilities, "decide", None)
    if decide is None or dataset is None or not len(dataset):
        return None
    device = next((p.device for p in pl_module.parameters()), torch.device("cpu"))
    plugin = getattr(trainer, "precision_plugin", None)
    ctx = plugin.forward_context if plugin is not None else contextlib.nullcontext
    with checking_state(pl_module, 0):
        pb = next(iter_probe(dataset, list(range(min(batch_size, len(dataset)))), batch_size, hooks))
        with ctx():
            out = pl_module(pb.images.to(device))
    try:
        return decide(out)
    except NonFiniteOutputError:  # the check reports NaN/inf itself, naming the epoch, probe and cases
        return None


def make_predict(trainer: Any, pl_module: Any, to_probabilities: Callable) -> Callable:
    """``predict(images) -> probabilities`` under the trainer's precision (autocast) context."""
    plugin = getattr(trainer, "precision_plugin", None)
    ctx = plugin.forward_context if plugin is not None else contextlib.nullcontext

    def predict(images: torch.Tensor) -> torch.Tensor:
        with ctx():
            out = pl_module(images)
        probs = to_probabilities(out)
        if not torch.is_tensor(probs) or probs.ndim != images.ndim or probs.shape[0] != images.shape[0] \
                or probs.shape[2:] != images.shape[2:]:
            want = "(B,K,H,W,D)" if images.ndim == 5 else "(B,K,H,W)"
            raise HookError(f"to_probabilities must return {want} matching the images {tuple(images.shape)}, "
                            f"got {getattr(probs, 'shape', type(probs).__name__)}; fix to_probabilities=")
        return probs.float()

    return predict


@contextlib.contextmanager
def checking_state(pl_module: torch.nn.Module, seed: int) -> Iterator[None]:
    """Eval mode, no_grad, seeded RNGs; restores every module's mode and all RNG states."""
    modes = [(m, m.training) for m in pl_module.modules()]
    rng = (torch.get_rng_state(), np.random.get_state(), random.getstate(),
           torch.cuda.get_rng_state_all() if torch.cuda.is_available() and torch.cuda.is_initialized() else None)
    try:
        pl_module.eval()
        # seeding makes anything random in the datasets' __getitem__ replay each epoch
        torch.manual_seed(seed)
        np.random.seed(seed % 2**32)
        random.seed(seed)
        with torch.no_grad():
            yield
    finally:
        for m, was in modes:
            m.training = was
        torch.set_rng_state(rng[0])
        np.random.set_state(rng[1])
        random.setstate(rng[2])
        if rng[3] is not None:
            torch.cuda.set_rng_state_all(rng[3])


def progress_bar(trainer: Any, total: int, desc: str):
    """A tqdm bar consistent with Lightning's (same class/position; off when Lightning's is off)."""
    bar_cb = getattr(trainer, "progress_bar_callback", None)
    disabled = bar_cb is None or getattr(bar_cb, "is_disabled", False) or not trainer.is_global_zero
    try:  # the trainer's own namespace (lightning.pytorch or pytorch_lightning)
        from .compat import tqdm_bar_class

        TQDMProgressBar, tqdm_cls = tqdm_bar_class(trainer)
    except (ImportError, AttributeError):  # pragma: no cover - lightning always ships both
        from tqdm import tqdm as tqdm_cls
        TQDMProgressBar = ()
    pos = 2 * getattr(bar_cb, "process_position", 0) + 1 if isinstance(bar_cb, TQDMProgressBar) else 0
    return tqdm_cls(total=total, desc=desc, leave=False, disable=disabled, position=pos,
                    dynamic_ncols=True, file=sys.stdout, smoothing=0)
