"""Turning model outputs into probabilities, refusing outputs no robustness figure may rest on.

A metamorphic check compares labels of clean and perturbed images. Two silent failures make
every figure meaningless: NaN/inf outputs (every label becomes class 0, EFR 0 % everywhere)
and outputs that already are probabilities being squashed again (sigmoid of a probability is
always > 0.5: everything becomes foreground). Both raise here, once, with the fix.

``to_probabilities`` choices (:func:`to_probabilities_fn`): ``None``/``"auto"`` (logits: sigmoid
for one channel, softmax for K; :class:`AutoProbabilities` decides once what the outputs are),
``"logits"`` (the same without looking), ``"identity"`` (the model returns probabilities), or a
callable ``outputs -> (B,K,H,W) probabilities``. The argument goes to the MetamorphicCallback:
``MetamorphicCallback(hooks=BatchHooks(to_probabilities=...))`` (``BatchHooks`` is importable from
``robusttrain.callbacks``).

"auto" never stops a run that has trained: one channel of values in [0,1] cannot tell logits from
probabilities (a freshly initialised or BCE-trained conv gives such logits), so it warns once and
reads them as logits. Only :meth:`AutoProbabilities.decide`, called on a batch before training,
refuses outputs that are unambiguously probabilities (K>1 channels summing to 1); the same outputs
met later switch "auto" to "identity" with a warning.

>>> import torch
>>> conv = to_probabilities_fn("identity")
>>> conv(torch.full((1, 1, 2, 2), 0.75))[0, :, 0, 0].tolist()
[0.25, 0.75]
>>> auto = to_probabilities_fn(None)
>>> auto.decide(torch.tensor([[[[0.2]], [[0.8]]]]) + torch.zeros(1, 2, 2, 2))
Traceback (most recent call last):
...
robusttrain.metamorphic.outputs.ProbabilityOutputError: model outputs look like probabilities already (2 channels, values in [0.2, 0.8], channels sum to 1), but logits were expected: softmax would be applied twice. Pass MetamorphicCallback(hooks=BatchHooks(to_probabilities='identity')) if the model returns probabilities (or to_probabilities='logits' if these really are logits)
>>> auto(torch.tensor([-2.0, 3.0]).view(1, 1, 2, 1)).shape, auto.kind   # values outside [0,1]: logits
(torch.Size([1, 2, 2, 1]), 'logits')
"""

from __future__ import annotations

import logging
import math
from collections.abc import Callable, Sequence
from typing import Any

import torch

from robusttrain.errors import InputError

from .batch import HookError

TO_PROBABILITIES = ("auto", "logits", "identity")
WHERE = "MetamorphicCallback(hooks=BatchHooks(to_probabilities={v!r}))"
log = logging.getLogger(__name__)
_SUM_TOL = 1e-3  # softmax outputs in float16 sum to 1 within ~1e-3


class NonFiniteOutputError(InputError):
    """Model outputs or probabilities hold NaN/inf. ``epoch``/``split`` say where, when known."""

    def __init__(
        self, what: str, epoch: int | None = None, split: str | None = None, case_ids: Sequence[str] = ()
    ):
        self.what, self.epoch, self.split, self.case_ids = what, epoch, split, list(case_ids)
        where = "".join(
            [
                f" at epoch {epoch}" if epoch is not None else "",
                f" on the '{split}' probe" if split is not None else "",
                f" (cases {_some(self.case_ids)})" if self.case_ids else "",
            ]
        )
        super().__init__(
            f"{what} contain NaN or inf{where}: the robustness check stops here "
            f"(no EFR, corner cases or checkpoint choice from them)"
        )

    def at(
        self, epoch: int | None = None, split: str | None = None, case_ids: Sequence[str] = ()
    ) -> NonFiniteOutputError:
        """The same error with the context filled in (fields already set are kept)."""
        return NonFiniteOutputError(
            self.what,
            self.epoch if self.epoch is not None else epoch,
            self.split if self.split is not None else split,
            self.case_ids or case_ids,
        )


def _some(ids: list[str], n: int = 4) -> str:
    return str(ids) if len(ids) <= n else f"{ids[:n]} and {len(ids) - n} more"


class ProbabilityOutputError(HookError):
    """Outputs that look like probabilities where logits were expected (or the reverse);
    the message names the ``to_probabilities=`` value to pass."""


def main_output(outputs: Any) -> torch.Tensor:
    """The segmentation tensor of a model's outputs: a tensor, a dict with ``logits``/``out``/
    ``pred``/``preds``, or a list/tuple whose first item is the main head (deep supervision)."""
    if isinstance(outputs, dict):
        outputs = next((outputs[k] for k in ("logits", "out", "pred", "preds") if k in outputs), outputs)
    if isinstance(outputs, (list, tuple)) and outputs and torch.is_tensor(outputs[0]):
        outputs = outputs[0]
    if not torch.is_tensor(outputs) or outputs.ndim not in (4, 5):
        raise ProbabilityOutputError(
            "cannot turn the model's outputs into (B,K,H,W) or (B,K,H,W,D) probabilities (got "
            f"{getattr(outputs, 'shape', type(outputs).__name__)}); pass {WHERE.format(v=...)} "
            "with a callable outputs -> probabilities"
        )
    return outputs


def _range(t: torch.Tensor, what: str) -> tuple[float, float]:
    # min/max propagate NaN, so one reduction answers "finite?" and "in [0,1]?"
    lo, hi = torch.stack(torch.aminmax(t.detach())).tolist()  # one read back, not one per bound
    if not (math.isfinite(lo) and math.isfinite(hi)):
        raise NonFiniteOutputError(what)
    return lo, hi


def logits_to_probabilities(logits: torch.Tensor, detect_probabilities: bool = True) -> torch.Tensor:
    """Model logits -> (B,K,H,W) probabilities: (B,1,H,W) sigmoid (as [1-p, p]), else softmax.

    Refuses NaN/inf (:class:`NonFiniteOutputError`) and, with ``detect_probabilities``, outputs
    that already look like probabilities (:class:`ProbabilityOutputError`): all values in [0,1],
    not constant, and for K>1 channels summing to 1.

    >>> logits_to_probabilities(torch.zeros(1, 1, 2, 2)).shape
    torch.Size([1, 2, 2, 2])
    """
    logits = logits.float()  # AMP outputs may be half; sums and argmax want full precision
    lo, hi = _range(logits, "model outputs (logits)")
    if detect_probabilities and _verdict(logits, lo, hi) != "logits":
        raise ProbabilityOutputError(_looks_like(logits, lo, hi))
    if logits.shape[1] == 1:
        p = torch.sigmoid(logits)
        return torch.cat([1 - p, p], dim=1)
    return torch.softmax(logits, dim=1)


def _verdict(t: torch.Tensor, lo: float, hi: float) -> str:
    """ "logits", "probabilities" (K>1 channels in [0,1] summing to 1: unambiguous) or "ambiguous"
    (one channel, not constant, all values in [0,1]: sigmoid outputs and small logits look alike)."""
    if not 0.0 <= lo < hi <= 1.0:
        return "logits"
    if t.shape[1] == 1:
        return "ambiguous"
    return "probabilities" if float((t.sum(1) - 1).abs().max()) <= _SUM_TOL else "logits"


def _looks_like(t: torch.Tensor, lo: float, hi: float) -> str:
    k = t.shape[1]
    fn, extra = ("sigmoid", "") if k == 1 else ("softmax", ", channels sum to 1")
    return (
        f"model outputs look like probabilities already ({k} channel{'s' * (k > 1)}, values in "
        f"[{lo:.3g}, {hi:.3g}]{extra}), but logits were expected: {fn} would be applied twice. "
        f"Pass {WHERE.format(v='identity')} if the model returns probabilities "
        "(or to_probabilities='logits' if these really are logits)"
    )


class AutoProbabilities:
    """``to_probabilities="auto"``: logits unless the outputs show otherwise, decided once (module doc).

    ``kind`` is None until decided, then ``"logits"`` or ``"identity"``. Calls never raise on the
    logits/probabilities question (only on NaN/inf); :meth:`decide` (before training) may.
    """

    def __init__(self) -> None:
        self.kind: str | None = None
        self.warned = False

    def decide(self, outputs: Any) -> str | None:
        """Look at outputs computed before training: refuse unambiguous probabilities, settle on
        logits when values leave [0,1]; one ambiguous channel warns once and stays undecided."""
        t = main_output(outputs).float()
        lo, hi = _range(t, "model outputs (logits)")
        verdict = _verdict(t, lo, hi)
        if verdict == "probabilities":
            raise ProbabilityOutputError(_looks_like(t, lo, hi))
        if verdict == "logits":
            self.kind = "logits"
        else:
            self._warn_ambiguous(lo, hi)
        return self.kind

    def __call__(self, outputs: Any) -> torch.Tensor:
        t = main_output(outputs)
        if self.kind == "identity":
            return identity_probabilities(t)
        if self.kind is None:
            tf = t.float()
            lo, hi = _range(tf, "model outputs (logits)")
            verdict = _verdict(tf, lo, hi)
            if verdict == "logits":
                self.kind = "logits"
            elif verdict == "probabilities":  # unambiguous: a second softmax would flatten every score
                self.kind = "identity"
                log.warning(
                    "%s; reading them as probabilities from now on (to_probabilities='identity')",
                    _looks_like(tf, lo, hi).split(". Pass")[0],
                )
                return identity_probabilities(t)
            else:
                self._warn_ambiguous(lo, hi)
        return logits_to_probabilities(t, detect_probabilities=False)

    def _warn_ambiguous(self, lo: float, hi: float) -> None:
        if self.warned:
            return
        self.warned = True
        log.warning(
            "model outputs have 1 channel with every value in [%.3g, %.3g]: logits or sigmoid "
            "probabilities? Reading them as logits (sigmoid applied). If the model returns "
            "probabilities, pass %s; pass %s to silence this",
            lo,
            hi,
            WHERE.format(v="identity"),
            WHERE.format(v="logits"),
        )


def identity_probabilities(probs: torch.Tensor) -> torch.Tensor:
    """Outputs that are probabilities already: (B,1,H,W) foreground -> [1-p, p]; checked in [0,1]."""
    probs = probs.float()
    lo, hi = _range(probs, "model outputs (probabilities)")
    if lo < -_SUM_TOL or hi > 1 + _SUM_TOL:
        raise ProbabilityOutputError(
            f"to_probabilities='identity' but the model outputs lie in [{lo:.3g}, {hi:.3g}], not [0,1]; "
            f"they look like logits: pass {WHERE.format(v='auto')}"
        )
    return torch.cat([1 - probs, probs], dim=1) if probs.shape[1] == 1 else probs


def to_probabilities_fn(spec: str | Callable | None) -> Callable[[Any], torch.Tensor]:
    """``outputs -> (B,K,H,W) probabilities`` for a ``to_probabilities=`` value (see module doc)."""
    if callable(spec):
        return spec
    name = "auto" if spec is None else spec
    if name not in TO_PROBABILITIES:
        raise ValueError(
            f"to_probabilities={spec!r}: expected one of {TO_PROBABILITIES} or a callable "
            "outputs -> (B,K,H,W) probabilities"
        )
    if name == "identity":
        return lambda out: identity_probabilities(main_output(out))
    if name == "auto":
        return AutoProbabilities()
    return lambda out: logits_to_probabilities(main_output(out), detect_probabilities=False)


def check_probabilities(probs: torch.Tensor) -> None:
    """Probabilities about to become labels: finite and in [0,1] (what ``to_probabilities`` promised)."""
    lo, hi = _range(probs, "model probabilities")
    if lo < -_SUM_TOL or hi > 1 + _SUM_TOL:
        raise ProbabilityOutputError(
            f"probabilities must lie in [0,1], got values in [{lo:.3g}, {hi:.3g}]: did to_probabilities= "
            "return logits? (leave it unset for logits, or 'identity' for probabilities)"
        )
