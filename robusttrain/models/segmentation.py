"""SegmentationModule: a plain Lightning segmentation model (MONAI net, Dice+CE, AdamW+cosine)."""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import lightning as L
import torch
from lightning.pytorch.utilities import rank_zero_info
from lightning.pytorch.utilities.types import OptimizerLRScheduler
from monai.losses import DiceCELoss
from torch.optim.lr_scheduler import CosineAnnealingLR, LinearLR, LRScheduler, SequentialLR
from torchmetrics.segmentation import DiceScore
from typing_extensions import override

from robusttrain.models.batch_norm import check_batches
from robusttrain.models.case_dice import CaseDice
from robusttrain.models.networks import Normalised, build_network, check_sides, side_multiple
from robusttrain.training.objective import metamorphic_forward, metamorphic_loss
from robusttrain.training.schedules import stretch_tail, warmup_cosine_tail
from robusttrain.validate import check_fraction


class SegmentationModule(L.LightningModule):
    """Multi-class segmentation with softmax over ``num_classes`` logits (background = 0).

    Batches are dicts with ``image`` (B,C,H,W) float and ``mask`` (B,H,W) int64 (with ``spatial_dims=3``:
    (B,C,H,W,D) and (B,H,W,D)). ``network``, ``features``, ``backbone``, ``pretrained`` and ``norm`` pick
    the MONAI network (:func:`~robusttrain.models.build_network`). Logs ``train/loss``, ``val/loss``,
    ``val/dice`` -- the per-case Dice (all of a case's pixels together, mean over foreground classes)
    averaged over the ``val/cases`` cases, the number ``history.csv``, ``check`` and the report show --
    with ``val/dice_<class>`` per class, and ``val/dice_pooled`` (``val/dice_pooled_<class>`` with more than
    one class): one Dice over every pixel of the set, as in the papers' tables (:mod:`.case_dice`);
    ``test/...`` the same for ``trainer.test``. ``predict_step`` returns class probabilities.

    With a :class:`~robusttrain.callbacks.MetamorphicTraining` callback on the trainer, the training step
    has both objectives' lines built in: ``objective="consistency"`` runs one forward over the batch and
    its follow-ups and adds ``lambda * D(p(x), p(x*))`` (:func:`~robusttrain.training.metamorphic_forward`);
    ``objective="paired"`` adds ``L_seg(x*) + lambda * D`` (:func:`~robusttrain.training.metamorphic_loss`).

    >>> import torch
    >>> m = SegmentationModule(in_channels=3, num_classes=2, features=(8, 8, 16, 32, 64, 8))
    >>> m.predict_step({"image": torch.rand(2, 3, 32, 32)}, 0).shape
    torch.Size([2, 2, 32, 32])
    """

    def __init__(
        self,
        in_channels: int = 3,
        num_classes: int = 2,
        network: str = "basic_unet",
        features: Sequence[int] | None = None,
        dropout: float = 0.0,
        class_names: Sequence[str] | None = None,
        lr: float = 2e-3,
        weight_decay: float = 1e-4,
        warmup_epochs: int = 0,
        lr_tail: float = 0.0,
        spatial_dims: int = 2,
        backbone: str | None = None,
        pretrained: bool | str = False,
        norm: str | None = None,
        encoder_lr_mult: float = 1.0,
    ) -> None:
        super().__init__()
        if (
            isinstance(encoder_lr_mult, bool)
            or not isinstance(encoder_lr_mult, (int, float))
            or not (0 < encoder_lr_mult <= 1)
        ):
            raise ValueError(
                f"model.encoder_lr_mult must be a number in (0, 1] (the encoder's LR is lr times it), "
                f"got {encoder_lr_mult!r}"
            )
        if isinstance(warmup_epochs, bool) or not isinstance(warmup_epochs, int) or warmup_epochs < 0:
            raise ValueError(f"model.warmup_epochs must be an integer >= 0, got {warmup_epochs!r}")
        lr_tail = check_fraction("lr_tail", lr_tail, why="the constant-LR tail's fraction of max_epochs")
        if num_classes < 2:
            raise ValueError(f"model.num_classes must be >= 2 (background + foreground), got {num_classes}")
        self.save_hyperparameters()
        self.net = build_network(
            network,
            in_channels,
            num_classes,
            features=list(features) if features is not None else None,
            dropout=dropout,
            spatial_dims=spatial_dims,
            backbone=backbone,
            pretrained=pretrained,
            norm=norm,
        )
        # checked once per input shape in forward: a size the network cannot take fails with one line
        self.side_multiple = side_multiple(network, features)  # every input side a multiple of this
        self._sides_ok: tuple[int, ...] | None = None
        names = list(class_names) if class_names else [f"class{i}" for i in range(1, num_classes)]
        if len(names) != num_classes - 1:
            raise ValueError(
                f"model.class_names has {len(names)} names but num_classes={num_classes} "
                f"needs {num_classes - 1} (foreground classes only)"
            )
        self.class_names = names
        self.loss_fn = DiceCELoss(to_onehot_y=True, softmax=True, include_background=False)
        # Pooled (dataset-level) Dice per foreground class, as in the papers' tables: val/dice_pooled.
        self.val_dice = DiceScore(
            num_classes=num_classes,
            include_background=False,
            average="none",
            aggregation_level="global",
            input_format="index",
        )
        self.case_dice = CaseDice()  # the headline val/dice: per case, then the mean over cases

    @override
    def forward(self, images: torch.Tensor) -> torch.Tensor:
        sides = tuple(images.shape[2:])
        if sides != self._sides_ok:
            check_sides(self.hparams["network"], self.side_multiple, sides)
            self._sides_ok = sides
        return self.net(images)

    def _loss(self, batch: dict) -> tuple[torch.Tensor, torch.Tensor]:
        logits = self(batch["image"])
        return self.loss_fn(logits, batch["mask"].unsqueeze(1)), logits

    @override
    def training_step(self, batch: dict, batch_idx: int) -> torch.Tensor:
        # the MR as a training objective: both terms are 0 without a MetamorphicTraining callback (or
        # with objective="replace", whose follow-ups are already in the batch)
        logits, mr = metamorphic_forward(self, batch["image"])
        loss = self._seg_loss(logits, batch["mask"])
        self.log("train/loss", loss, prog_bar=True, batch_size=batch["image"].shape[0])
        return loss + mr + metamorphic_loss(self, batch, logits, self._seg_loss, required=False)

    def _seg_loss(self, logits: torch.Tensor, masks: torch.Tensor) -> torch.Tensor:
        return self.loss_fn(logits, masks.unsqueeze(1))

    @override
    def validation_step(self, batch: dict, batch_idx: int) -> None:
        loss, logits = self._loss(batch)
        self.log("val/loss", loss, prog_bar=True, sync_dist=True, batch_size=batch["image"].shape[0])
        self._score(batch, logits)

    def _score(self, batch: dict, logits: torch.Tensor) -> None:
        self.val_dice.update(logits.argmax(1), batch["mask"])
        rank = self._trainer.global_rank if self._trainer is not None else 0
        self.case_dice.update(batch, logits, batch["mask"], rank)

    @override
    def on_validation_epoch_end(self) -> None:
        metrics = self._dice_metrics("val")
        head = metrics.pop("val/dice", None)
        self.log_dict(metrics, prog_bar=False)
        if head is not None:
            self.log("val/dice", head, prog_bar=True)

    def _dice_metrics(self, prefix: str) -> dict[str, torch.Tensor]:
        """``<prefix>/dice`` (per-case mean), per class, ``<prefix>/cases`` and the pooled Dice; resets both."""
        pooled = self.val_dice.compute().reshape(-1)  # 0-d when there is one foreground class
        self.val_dice.reset()
        parts = self.case_dice.parts
        self.case_dice.reset()
        if self._trainer is not None:
            from robusttrain.callbacks._dist import gather_objects  # every rank's cases

            per_case, n = CaseDice.merge(gather_objects(self._trainer, parts))
        else:
            per_case, n = CaseDice.merge([parts])
        if n == 0:  # nothing scored (an empty loader): no headline rather than a made-up one
            return {}
        metrics = {f"{prefix}/dice": torch.tensor(float(per_case.mean()))}
        metrics.update(
            {f"{prefix}/dice_{c}": torch.tensor(float(d)) for c, d in zip(self.class_names, per_case)}
        )
        metrics[f"{prefix}/cases"] = torch.tensor(float(n))
        metrics[f"{prefix}/dice_pooled"] = pooled.mean()
        if len(self.class_names) > 1:
            metrics.update({f"{prefix}/dice_pooled_{c}": d for c, d in zip(self.class_names, pooled)})
        return metrics

    @override
    def test_step(self, batch: dict, batch_idx: int) -> None:
        loss, logits = self._loss(batch)
        self.log("test/loss", loss, sync_dist=True, batch_size=batch["image"].shape[0])
        self._score(batch, logits)

    @override
    def on_test_epoch_end(self) -> None:
        self.log_dict(self._dice_metrics("test"))

    @override
    def predict_step(self, batch: Any, batch_idx: int, dataloader_idx: int = 0) -> torch.Tensor:
        images = batch["image"] if isinstance(batch, dict) else batch[0]
        return self(images).softmax(1)

    @override
    def configure_optimizers(self) -> OptimizerLRScheduler:
        """AdamW over :meth:`param_groups`; cosine decay over ``trainer.max_epochs`` after ``warmup_epochs`` of linear warm-up; with
        ``lr_tail > 0`` the LR stays constant over the last ``lr_tail`` of the epochs (the value the cosine
        has where the tail starts: SWA/SWAD average under a constant LR, see
        :mod:`robusttrain.training.schedules`)."""
        opt = torch.optim.AdamW(
            self.param_groups(), lr=self.hparams["lr"], weight_decay=self.hparams["weight_decay"]
        )
        warmup = int(self.hparams["warmup_epochs"] or 0)
        total = max(1, int(self.trainer.max_epochs or 1))
        lr_tail = float(self.hparams.get("lr_tail", 0.0) or 0.0)
        if lr_tail > 0:
            tail = warmup_cosine_tail(opt, total, warmup, lr_tail)
            return {"optimizer": opt, "lr_scheduler": {"scheduler": tail, "interval": "epoch"}}
        sched: LRScheduler = CosineAnnealingLR(opt, T_max=max(1, total - warmup))
        if warmup > 0:
            ramp = LinearLR(opt, start_factor=1.0 / (warmup + 1), total_iters=warmup)
            sched = SequentialLR(opt, [ramp, sched], milestones=[warmup])
        return {"optimizer": opt, "lr_scheduler": {"scheduler": sched, "interval": "epoch"}}

    @property
    def pretrained_weights(self) -> dict[str, str] | None:
        """The verified weight file the network was built from (``package``, ``file``, ``sha256``), or None
        (random init, or weights a network's own loader fetched without naming them)."""
        net = self.net.net if isinstance(self.net, Normalised) else self.net
        weights = getattr(net, "weights", None)
        return dict(weights) if isinstance(weights, dict) else None

    def param_groups(self) -> list[dict[str, Any]]:
        """The network's parameters, a pretrained encoder's (a network's ``encoder``) in a group of its own
        at ``lr * encoder_lr_mult`` when that is below 1: fine-tuning moves ImageNet features less than
        the decoder, which starts from random.

        >>> m = SegmentationModule(network="lite0_unet", encoder_lr_mult=0.1, lr=1e-3)
        >>> [(g["name"], g.get("lr")) for g in m.param_groups()]
        [('rest', None), ('encoder', 0.0001)]
        """
        mult = float(self.hparams.get("encoder_lr_mult", 1.0) or 1.0)
        net = self.net.net if isinstance(self.net, Normalised) else self.net
        encoder = getattr(net, "encoder", None)
        if mult == 1.0 or not isinstance(encoder, torch.nn.Module):
            return [{"params": list(self.parameters()), "name": "all"}]
        own = {id(p) for p in encoder.parameters()}
        return [  # the module's lr first: group 0 is what LR logs and the averages' windows report
            {"params": [p for p in self.parameters() if id(p) not in own], "name": "rest"},
            {"params": list(encoder.parameters()), "lr": self.hparams["lr"] * mult, "name": "encoder"},
        ]

    @override
    def on_train_start(self) -> None:
        # a BatchNorm network refuses a batch of one case before the first step (one line, not a
        # mid-epoch error or silently noisy statistics)
        trainer = self.trainer
        if trainer.train_dataloader is not None:
            name = f"model.network={self.hparams['network']}"
            check_batches(
                self, trainer.train_dataloader, trainer.world_size, trainer.num_training_batches, name
            )
        # A run resumed with a larger trainer.max_epochs gets back the schedule it was saved with:
        # the cosine's T_max is the old length, so every added epoch would train at the final LR (0).
        # Stretch the cosine to the new length and set the LR to where the longer cosine is now.
        # Unchanged max_epochs (an exact resume) leaves everything as restored.
        max_epochs = int(self.trainer.max_epochs or 0)
        if max_epochs < 1:
            return
        for config in self.trainer.lr_scheduler_configs:
            stretch_cosine(config.scheduler, max_epochs - int(self.hparams["warmup_epochs"] or 0))
            stretch_tail(config.scheduler, max_epochs)


def stretch_cosine(scheduler: Any, t_max: int) -> bool:
    """Give a (possibly nested) :class:`CosineAnnealingLR` a new length ``t_max`` mid-run.

    The LR of each param group is set to the closed-form cosine value at the scheduler's current
    epoch under the new length (the recursive form PyTorch steps with cannot leave 0 once there).
    Returns whether anything changed.

    >>> opt = torch.optim.SGD([torch.zeros(1, requires_grad=True)], lr=1.0)
    >>> s = CosineAnnealingLR(opt, T_max=2)
    >>> for _ in range(2): opt.step(); s.step()
    >>> opt.param_groups[0]["lr"]
    0.0
    >>> stretch_cosine(s, 4), round(opt.param_groups[0]["lr"], 6)
    (True, 0.5)
    """
    inner = getattr(scheduler, "_schedulers", [scheduler])
    changed = False
    for s in inner:
        t_max = max(1, int(t_max))
        if not isinstance(s, CosineAnnealingLR) or s.T_max == t_max:
            continue
        old, s.T_max, changed = s.T_max, t_max, True
        epoch = max(0, int(s.last_epoch))
        for group, base in zip(s.optimizer.param_groups, s.base_lrs):
            group["lr"] = (
                s.eta_min + (base - s.eta_min) * (1 + math.cos(math.pi * min(epoch, t_max) / t_max)) / 2
            )
        s._last_lr = [g["lr"] for g in s.optimizer.param_groups]
        rank_zero_info(
            f"[robusttrain] cosine LR schedule stretched from {old} to {t_max} epochs "
            f"(trainer.max_epochs changed on resume); LR now {s._last_lr[0]:.3g}"
        )
    return changed
