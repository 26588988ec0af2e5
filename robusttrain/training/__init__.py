"""Training on what the metamorphic check finds: online worst-of-k perturbation and the MR-consistency
objective (pure torch; the Lightning glue is :class:`robusttrain.callbacks.MetamorphicTraining` and
:func:`robusttrain.callbacks.metamorphic_loss`)."""

from .consistency import DIVERGENCES, divergence, probabilities, ramp, soft_dice_loss
from .worst_of_k import OCCLUDERS, Followups, WorstOfK, scaled_for_scoring

__all__ = [
    "DIVERGENCES",
    "OCCLUDERS",
    "Followups",
    "WorstOfK",
    "divergence",
    "probabilities",
    "ramp",
    "scaled_for_scoring",
    "soft_dice_loss",
]
