"""MetamorphicTraining: train on the worst of k perturbations of each batch, steered by what the
metamorphic check measured, optionally with the MR as a consistency loss.

Two ways to use it (the pure-torch parts are :mod:`robusttrain.training`):

* **No code change** (``consistency=0``): before each training step, a fraction ``q`` of the batch's
  images is replaced *in place* by its worst-of-``k`` follow-up (the model scores ``k`` candidate
  perturbations per image without gradients, in eval mode, at ``score_scale`` of the size, and the
  worst is kept). The model trains on ``L_seg`` of the mixed batch.
* **MR-consistency** (``consistency=lambda > 0``): the batch stays clean and the follow-ups wait
  beside it; one line in ``training_step`` adds ``L_seg(x*) + lambda * D(p(x), p(x*))``::

      from robusttrain.callbacks import metamorphic_loss
      loss = loss + metamorphic_loss(self, batch, logits, self.loss_fn)   # the MR as a training objective

  ``lambda`` ramps from 0 over the first ``ramp`` fraction of the training steps. The recipes'
  :class:`~robusttrain.models.SegmentationModule` has the line built in.

The family of each candidate is drawn from ``(1 - epsilon) * w + epsilon * uniform``, ``w`` the
per-family violation rates of the latest metamorphic check (the training probe's when failure
mining checks one, else the validation probe's), read from the shared
:class:`~robusttrain.callbacks.context.RobustnessContext`; uniform without a MetamorphicCallback.
Every draw comes from a generator seeded by ``(seed, global step, global rank)``: identical under any
load, after a resume, and each DDP rank draws for its own shard with the weights every rank shares.
``k=1`` is random augmentation with the same families and dose (nothing is scored). Per-epoch counts go
to ``metamorphic_training.csv`` and a sample of the kept follow-ups' params to
``metamorphic_training_samples.jsonl`` (:mod:`robusttrain.rundir.metamorphic_training`).

Example::

    >>> import lightning.pytorch as L
    >>> mt = MetamorphicTraining(perturbations=["blur", "contrast"], k=4, q=0.5)
    >>> trainer = L.Trainer(max_epochs=1, callbacks=[mt], logger=False)   # then trainer.fit(...)
"""

from __future__ import annotations

import contextlib
import math
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import pandas as pd
import torch
from lightning.pytorch import Callback
from lightning.pytorch.utilities import rank_zero_info

from robusttrain.metamorphic.batch import BatchHooks, normalise_mask
from robusttrain.metamorphic.check import eval_state as scoring_state  # eval, no grad, modes + RNGs restored
from robusttrain.perturbations import available
from robusttrain.perturbations.suites import resolve
from robusttrain.rundir import metamorphic_training as records_file
from robusttrain.training import WorstOfK, divergence, probabilities, ramp, scaled_for_scoring, soft_dice_loss
from robusttrain.training.consistency import DIVERGENCES
from robusttrain.validate import check_choice, check_fraction, check_int

from ._dist import gather_objects
from .context import RobustnessConfigError, RobustnessContext, UsesContext

DEFAULT_CAP = 4  # without a MetamorphicCallback: the recipes' highest tested severity


class MetamorphicTraining(UsesContext, Callback):
    """Online worst-of-k perturbation (and the MR-consistency objective) for any Lightning model.

    Args:
        perturbations: families or a suite name (default: the MetamorphicCallback's suite, else the
            endoscopy suite); families that cannot run on the data's channel count are dropped.
        k: candidates per image (1 = random augmentation, the ablation).
        q: fraction of each batch that gets a follow-up.
        epsilon: uniform share of the family choice, in [0, 1] (the rest follows the check's rates).
        temperature: 0 keeps the worst candidate; > 0 samples by ``softmax(loss / temperature)``.
        severity_caps: highest severity drawn, an int or per family (default: the MR suite's highest).
        max_cover: occluding candidates changing more of the lesion than this are never kept.
        consistency: ``lambda`` of the MR-consistency term (0: replace in place, no code change). Any
            value > 0 trains the follow-ups beside the clean batch; in Evidence v3 (docs/results.md)
            that stalled training in one seed of three at every weight tried (1, 0.1, 1e-9, detached),
            where ``consistency=0`` trained; the recipes use ``k=1, epsilon=1, consistency=0``.
        divergence: ``"js"`` (default), ``"kl"`` or ``"mse"``.
        detach_source: stop the consistency gradient at the clean (source) prediction, so the follow-up
            is pulled towards the source and never the source towards the follow-up (the MR's direction;
            FixMatch / UDA do the same). ``False`` (default) is AugMix's symmetric JS, which also pulls
            the clean prediction towards the perturbed one.
        ramp: fraction of the training steps over which ``lambda`` grows from 0.
        score_scale: size of the scoring forward relative to the image (kept when the scaled size is a
            multiple of 16; 1.0 scores at full size).
        hooks: how batches are read (default: the MetamorphicCallback's, else dict / tuple batches).
        seed: seeds every draw with the step and rank.
        record_every, record_per_step: every N-th step, the first M kept follow-ups' params are written.
        dirpath: run directory (default: the context's).
        context: a shared :class:`RobustnessContext` (default: the trainer's).
    """

    def __init__(
        self,
        perturbations: str | Sequence[str] | None = None,
        k: int = 4,
        q: float = 0.5,
        epsilon: float = 0.3,
        temperature: float = 0.0,
        severity_caps: int | Mapping[str, int] | None = None,
        max_cover: float = 0.1,
        consistency: float = 0.0,
        divergence: str = "js",
        detach_source: bool = False,
        ramp: float = 0.2,
        score_scale: float = 0.5,
        hooks: BatchHooks | None = None,
        seed: int = 0,
        record_every: int = 50,
        record_per_step: int = 2,
        dirpath: str | None = None,
        context: RobustnessContext | None = None,
    ):
        self.perturbations = None if perturbations is None else resolve(perturbations)
        self.k = check_int("k", k, 1)
        self.q = check_fraction("q", q)
        self.epsilon = check_fraction("epsilon", epsilon)
        if isinstance(temperature, bool) or not isinstance(temperature, (int, float)) or temperature < 0:
            raise ValueError(f"temperature must be a number >= 0 (0 = keep the worst), got {temperature!r}")
        self.temperature = float(temperature)
        self.severity_caps = severity_caps
        self.max_cover = check_fraction("max_cover", max_cover)
        if (
            isinstance(consistency, bool)
            or not isinstance(consistency, (int, float))
            or not math.isfinite(consistency)
            or consistency < 0
        ):
            raise ValueError(
                f"consistency must be a weight >= 0 (0 = no consistency term), got {consistency!r}"
            )
        self.consistency = float(consistency)
        self.divergence = check_choice("divergence", divergence, DIVERGENCES)
        if not isinstance(detach_source, bool):
            raise ValueError(f"detach_source must be true or false, got {detach_source!r}")
        self.detach_source = detach_source
        self.ramp = check_fraction("ramp", ramp)
        if (
            isinstance(score_scale, bool)
            or not isinstance(score_scale, (int, float))
            or not 0 < score_scale <= 1
        ):
            raise ValueError(f"score_scale must be in (0, 1] (1 = score at full size), got {score_scale!r}")
        self.score_scale = float(score_scale)
        if hooks is not None and not isinstance(hooks, BatchHooks):
            raise ValueError(f"hooks must be a BatchHooks, got {type(hooks).__name__}")
        self.hooks = hooks
        self.seed = int(seed)
        self.record_every = check_int("record_every", record_every, 1)
        self.record_per_step = check_int("record_per_step", record_per_step, 0)
        self.dirpath, self._context_arg = dirpath, context
        self.wok: WorstOfK | None = None
        self.stats = pd.DataFrame(columns=records_file.STATS_COLUMNS)
        self.samples: list[dict[str, Any]] = []
        self._ctx: RobustnessContext | None = context
        self._acc: dict[str, Any] = {}
        self._pending: Any = None
        self._epoch_samples: list[dict[str, Any]] = []
        self._consumed = False
        self._steps_seen = 0
        self._rates_cache: tuple[Any, dict[str, float] | None] = (None, None)  # (efr table, its rates)

    @property
    def pair(self) -> bool:
        """Whether follow-ups wait beside the clean batch for :func:`metamorphic_loss`."""
        return self.consistency > 0

    # -- Lightning hooks ---------------------------------------------------------------
    def setup(self, trainer: Any, pl_module: Any, stage: str) -> None:
        if stage != "fit":
            return
        self.join_context(trainer)
        self.context.join(type(self).__name__, self.dirpath)

    def teardown(self, trainer: Any, pl_module: Any, stage: str) -> None:
        if stage == "fit" and self._ctx is not None:
            self._ctx.release_lock(trainer, type(self).__name__)

    def on_fit_start(self, trainer: Any, pl_module: Any) -> None:
        self.context.finalize(trainer)
        self._steps_seen = 0

    def on_train_epoch_start(self, trainer: Any, pl_module: Any) -> None:
        self._reset_acc()

    @torch.no_grad()
    def on_train_batch_start(self, trainer: Any, pl_module: Any, batch: Any, batch_idx: int) -> None:
        self._pending, self._consumed = None, False
        hooks = self._hooks()
        try:
            images = hooks.get_images(batch)
            masks = normalise_mask(hooks.get_masks(batch), images)
        except Exception as err:  # noqa: BLE001 -- one line saying which hook to set
            raise RobustnessConfigError(
                f"MetamorphicTraining cannot read the training batch: {err} "
                "(pass hooks=BatchHooks(get_images=..., get_masks=...))"
            ) from None
        if self.wok is None:
            self.wok = self._build(images)
        if self.wok.n_selected(images.shape[0]) == 0:
            return
        step = int(trainer.global_step)
        rates = self._rates()
        score = self._scorer(trainer, pl_module)
        if self._steps_seen == 0:  # what the perturbations need, said once before anything is drawn
            _check_images(images)
        fol = self.wok(images.detach(), masks, score, step=step, rank=int(trainer.global_rank), rates=rates)
        self._account(fol, rates)
        self._record(trainer, batch, fol)
        if self.pair:
            self._pending = (fol, hooks.get_masks(batch))
            return
        images[fol.index] = fol.images.to(images.dtype)
        if self._steps_seen == 0 and hooks.get_images(batch).data_ptr() != images.data_ptr():
            raise RobustnessConfigError(
                "MetamorphicTraining could not write follow-ups into the batch: get_images returns a copy; "
                "use consistency > 0 with metamorphic_loss(...) in training_step instead"
            )

    def on_train_batch_end(
        self, trainer: Any, pl_module: Any, outputs: Any, batch: Any, batch_idx: int
    ) -> None:
        if self.pair and self._pending is not None and not self._consumed and self._steps_seen == 0:
            raise RobustnessConfigError(
                f"MetamorphicTraining(consistency={self.consistency}) prepared follow-ups but training_step "
                "never called metamorphic_loss(self, batch, logits, loss_fn); add that line to training_step "
                "or set consistency=0 (follow-ups then replace images in place)"
            )
        self._steps_seen += 1
        self._pending = None

    def on_train_epoch_end(self, trainer: Any, pl_module: Any) -> None:
        rows = self._epoch_rows(int(trainer.current_epoch))
        parts = gather_objects(trainer, {"rows": rows, "samples": self._epoch_samples})
        self._epoch_samples = []
        merged = _merge_rows([r for p in parts for r in p["rows"]])  # the same on every rank
        kept = sum(r["chosen"] for r in merged)
        if kept:  # which artifacts the model trained on this epoch: one curve per family (W&B, CSV)
            pl_module.log_dict(
                {f"mt/kept_share/{r['family']}": r["chosen"] / kept for r in merged},
                on_step=False,
                on_epoch=True,
                sync_dist=False,
            )
        if not trainer.is_global_zero:
            return
        new = pd.DataFrame(merged, columns=records_file.STATS_COLUMNS)
        keep = (
            self.stats[self.stats["epoch"] != int(trainer.current_epoch)] if len(self.stats) else self.stats
        )
        self.stats = pd.concat([keep, new], ignore_index=True) if len(keep) else new
        self.samples.extend(
            sorted(
                (s for p in parts for s in p["samples"]), key=lambda r: (r["step"], r["rank"], r["position"])
            )
        )
        records_file.write_stats(self.context.resolved_run_dir, self.stats)
        records_file.write_samples(self.context.resolved_run_dir, self.samples)

    # -- the consistency term ------------------------------------------------------------
    def loss(
        self, pl_module: Any, batch: Any, outputs: Any, seg_loss: Callable | None = None
    ) -> torch.Tensor:
        """``L_seg(x*) + lambda * D(p(x), p(x*))`` for this step's follow-ups (0 when there are none)."""
        self._consumed = True
        zero = main_zero(outputs)
        if not self.pair or self._pending is None:
            return zero
        fol, target = self._pending
        idx = fol.index
        out_f = pl_module(fol.images)
        spec = self._hooks().to_probabilities
        p_clean = probabilities(_select(outputs, idx), spec)
        if self.detach_source:  # the source is the reference: only the follow-up moves to agree
            p_clean = p_clean.detach()
        p_fol = probabilities(out_f, spec)
        if seg_loss is not None:
            seg = seg_loss(out_f, _select(target, idx))
        else:
            seg = soft_dice_loss(p_fol, normalise_mask(_select(target, idx), fol.images)).mean()
        trainer = pl_module.trainer
        total = trainer.estimated_stepping_batches
        total = int(total) if math.isfinite(total) else 1000
        lam = self.consistency * ramp(int(trainer.global_step), total, self.ramp)
        cons = divergence(p_clean, p_fol, self.divergence)
        n = int(idx.numel())
        pl_module.log("mt/consistency", cons.detach(), on_step=False, on_epoch=True, batch_size=n)
        pl_module.log("mt/followup_loss", seg.detach(), on_step=False, on_epoch=True, batch_size=n)
        pl_module.log("mt/lambda", lam, on_step=False, on_epoch=True, batch_size=n)
        return seg + lam * cons

    # -- internals ---------------------------------------------------------------------
    def _hooks(self) -> BatchHooks:
        if self.hooks is not None:
            return self.hooks
        shared = getattr(self._ctx, "hooks", None)
        return shared if isinstance(shared, BatchHooks) else BatchHooks()

    def _build(self, images: torch.Tensor) -> WorstOfK:
        suite = getattr(self._ctx, "suite", None)
        names = self.perturbations or (list(suite.names) if suite is not None else resolve("endoscopy"))
        usable = set(available(int(images.shape[1])))
        families = [n for n in names if n in usable and n not in ("adversarial", "melt")]
        if not families:
            raise RobustnessConfigError(
                f"MetamorphicTraining: none of the perturbations {names} runs on {images.shape[1]}-channel "
                f"images; choose families from {sorted(usable)} (e.g. perturbations='mri' or 'xray')"
            )
        caps = self.severity_caps
        if caps is None:
            caps = max(suite.severities) if suite is not None else DEFAULT_CAP
        slice_axis = getattr(suite, "slice_axis", -1) if suite is not None else -1
        wok = WorstOfK(
            families,
            k=self.k,
            q=self.q,
            epsilon=self.epsilon,
            temperature=self.temperature,
            severity_caps=caps,
            max_cover=self.max_cover,
            seed=self.seed,
            slice_axis=slice_axis,
        )
        dropped = [n for n in names if n not in families]
        rank_zero_info(
            f"[robusttrain] metamorphic training: {self._what()} on q={self.q:g} of each batch, "
            f"families {families} ({self._draw()})"
            + (f" (not on this data: {dropped})" if dropped else "")
            + (f", consistency lambda={self.consistency:g} ({self.divergence})" if self.pair else "")
        )
        return wok

    def _what(self) -> str:
        # k=1 scores nothing: one random draw, i.e. augmentation
        return f"worst of k={self.k}" if self.k > 1 else "one random perturbation (k=1)"

    def _draw(self) -> str:
        return (
            "drawn uniformly"
            if self.epsilon >= 1.0
            else f"weighted by the MR check, {self.epsilon:g} uniform"
        )

    def _rates(self) -> dict[str, float] | None:
        """Per-family violation rates of the latest check (train probe if there is one, else val).

        Read every step but recomputed only when the MR callback has published a new table (each check
        replaces the frame), so the hot path does not filter a DataFrame per training step."""
        efr = getattr(self._ctx, "efr", None)
        if efr is None or not len(efr):
            return None
        if self._rates_cache[0] is efr:
            return self._rates_cache[1]
        rates = self._rates_of(efr)
        self._rates_cache = (efr, rates)
        return rates

    def _rates_of(self, efr: pd.DataFrame) -> dict[str, float] | None:
        t = getattr(self._ctx, "violation_threshold", None) or 0.25
        rows = efr[
            (efr["metric"] == "dice")
            & (efr["severity"] == 0)
            & (efr["perturbation"] != "all")
            & ((efr["threshold"] - t).abs() < 1e-9)
        ]
        split = "train" if (rows["split"] == "train").any() else "val"
        rows = rows[rows["split"] == split]
        if not len(rows):
            return None
        last = rows[rows["epoch"] == rows["epoch"].max()]
        return {str(p): float(v) for p, v in zip(last["perturbation"], last["efr"]) if v == v}

    def _scorer(self, trainer: Any, pl_module: Any) -> Callable[[torch.Tensor, torch.Tensor], torch.Tensor]:
        spec = self._hooks().to_probabilities

        def score(candidates: torch.Tensor, masks: torch.Tensor | None) -> torch.Tensor:
            if masks is None:  # normalise_mask always gives masks; scoring needs them
                raise RobustnessConfigError("MetamorphicTraining scores candidates against masks; got none")
            x, m = scaled_for_scoring(candidates, masks, self.score_scale)
            assert m is not None
            with scoring_state(pl_module), _forward_context(trainer):
                out = pl_module(x)
            return soft_dice_loss(probabilities(out, spec), m)

        return score

    def _reset_acc(self) -> None:
        self._acc = {}

    def _worst_of_k(self) -> WorstOfK:
        if self.wok is None:  # built from the first training batch (its channel count)
            raise RobustnessConfigError("MetamorphicTraining: no training batch has been seen yet")
        return self.wok

    def _account(self, fol: Any, rates: Mapping[str, float] | None) -> None:
        """Per-family counts and score sums, kept on the device (read once per epoch)."""
        wok = self._worst_of_k()
        fams = wok.families
        dev = fol.images.device
        if "cand" not in self._acc:
            z = lambda: torch.zeros(len(fams), dtype=torch.float64, device=dev)
            self._acc = {
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
            self._acc["cand"][j] += 1
        if not len(fol):
            return
        fi = fam_idx.to(dev)
        rej = fol.extra["rejected"]
        self._acc["rejected"].index_add_(0, fi.flatten(), rej.flatten().double())
        ok = fol.chosen >= 0
        sel = fi.gather(1, fol.chosen.clamp_min(0).view(-1, 1)).view(-1)
        self._acc["chosen"].index_add_(0, sel, ok.double())
        if fol.scores is not None:
            s = fol.scores.double()
            finite = torch.isfinite(s)
            self._acc["score"].index_add_(0, fi.flatten(), torch.where(finite, s, 0).flatten())
            self._acc["nscore"].index_add_(0, fi.flatten(), finite.double().flatten())
            cs = s.gather(1, fol.chosen.clamp_min(0).view(-1, 1)).view(-1)
            self._acc["chosen_score"].index_add_(0, sel, torch.where(ok, cs, 0))
        self._acc["weights"] = wok.family_probs(rates).tolist()

    def _epoch_rows(self, epoch: int) -> list[dict[str, Any]]:
        if "cand" not in self._acc:
            return []
        a = {k: (v.cpu().tolist() if torch.is_tensor(v) else v) for k, v in self._acc.items()}
        rows = []
        for i, fam in enumerate(self._worst_of_k().families):
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
        self._acc = {}
        return rows

    def _record(self, trainer: Any, batch: Any, fol: Any) -> None:
        step = int(trainer.global_step)
        if self.record_per_step == 0 or step % self.record_every:
            return
        ids = None
        try:
            ids = self._hooks().get_case_ids(batch)
        except Exception:  # noqa: BLE001 -- case ids are optional
            ids = None
        for i, rec in enumerate(fol.kept()[: self.record_per_step]):
            if rec is None:
                continue
            fam, sev, params = rec
            pos = int(fol.index[i])
            self._epoch_samples.append(
                {
                    "step": step,
                    "epoch": int(trainer.current_epoch),
                    "rank": int(trainer.global_rank),
                    "position": pos,
                    "case_id": None if ids is None else str(list(ids)[pos]),
                    "family": fam,
                    "severity": int(sev),
                    "params": {k: v.tolist() for k, v in params.items()},
                }
            )

    # -- checkpoint state --------------------------------------------------------------
    def state_dict(self) -> dict[str, Any]:
        return {
            "version": 1,
            "stats": {c: [_py(v) for v in self.stats[c].tolist()] for c in self.stats.columns},
            "samples": list(self.samples),
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        stats = state.get("stats") or {}
        self.stats = (
            pd.DataFrame(stats, columns=records_file.STATS_COLUMNS)
            if stats
            else pd.DataFrame(columns=records_file.STATS_COLUMNS)
        )
        self.samples = list(state.get("samples", []))


def metamorphic_loss(
    pl_module: Any, batch: Any, outputs: Any, seg_loss: Callable | None = None, *, required: bool = True
) -> torch.Tensor:
    """The MR-consistency term of this training step: ``L_seg(x*) + lambda * D(p(x), p(x*))``.

    Call it in ``training_step`` with the clean batch, the model's outputs on it and your segmentation
    loss (``seg_loss(outputs, target)``, applied to the follow-ups and their rows of the batch's masks;
    default: soft Dice). Returns 0 when the step has no follow-ups (or ``consistency=0``). Without a
    :class:`MetamorphicTraining` callback on the trainer it raises, unless ``required=False``.

    >>> import torch
    >>> class _M:  # no trainer callbacks: nothing to add
    ...     trainer = type("T", (), {"callbacks": []})()
    >>> float(metamorphic_loss(_M(), None, torch.zeros(1, 2, 4, 4), required=False))
    0.0
    """
    cb = next(
        (c for c in getattr(pl_module.trainer, "callbacks", []) if isinstance(c, MetamorphicTraining)), None
    )
    if cb is None:
        if required:
            raise RobustnessConfigError(
                "metamorphic_loss(...) needs a MetamorphicTraining(consistency=...) callback on the trainer"
            )
        return main_zero(outputs)
    return cb.loss(pl_module, batch, outputs, seg_loss)


def main_zero(outputs: Any) -> torch.Tensor:
    """A 0 on the outputs' device that keeps the graph (adding it changes nothing)."""
    from robusttrain.metamorphic.outputs import main_output

    return main_output(outputs).sum() * 0.0


def _forward_context(trainer: Any) -> Any:
    plugin = getattr(trainer, "precision_plugin", None)
    return plugin.forward_context() if plugin is not None else contextlib.nullcontext()


def _check_images(images: Any) -> None:
    """Training images the perturbations can take: float (B,C,H,W[,D]) in [0, 1]."""
    if not torch.is_tensor(images) or not images.is_floating_point() or images.ndim not in (4, 5):
        raise RobustnessConfigError(
            f"MetamorphicTraining needs float (B,C,H,W) or (B,C,H,W,D) training images, got "
            f"{getattr(images, 'dtype', type(images).__name__)} {tuple(getattr(images, 'shape', ()))}"
        )
    lo, hi = float(images.min()), float(images.max())
    if lo < 0.0 or hi > 1.0:
        raise RobustnessConfigError(
            f"MetamorphicTraining perturbs images in [0, 1], but the training images span [{lo:.3g}, {hi:.3g}] "
            "(normalise after the perturbation, e.g. in the model's forward, or pass hooks=BatchHooks(get_images=...))"
        )


def _select(outputs: Any, idx: torch.Tensor) -> Any:
    """Rows ``idx`` of a tensor, or of every tensor in a dict / tuple of outputs."""
    if torch.is_tensor(outputs):
        return outputs[idx]
    if isinstance(outputs, Mapping):
        return {k: _select(v, idx) for k, v in outputs.items()}
    if isinstance(outputs, (list, tuple)):
        return type(outputs)(_select(v, idx) for v in outputs)
    return outputs


def _merge_rows(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Sum the ranks' per-family rows; means from the sums."""
    out: dict[tuple[int, str], dict[str, Any]] = {}
    for r in rows:
        key = (r["epoch"], r["family"])
        if key not in out:
            out[key] = dict(r)
            continue
        for c in ("candidates", "chosen", "rejected", "score", "nscore", "chosen_score"):
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


def _py(v: Any) -> Any:
    return v.item() if hasattr(v, "item") else v
