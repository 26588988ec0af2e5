"""Training on what the metamorphic check finds: follow-up draws (worst-of-k, selection rules, AugMix-style
chains), the objectives and their divergences (pure torch; the Lightning glue is
:class:`robusttrain.callbacks.MetamorphicTraining`, the ``training_step`` lines
:func:`metamorphic_forward` / :func:`metamorphic_loss`)."""

from .chains import MIXES, ChainSampler
from .consistency import DIVERGENCES, divergence, probabilities, ramp, soft_dice_loss
from .objective import OBJECTIVES, metamorphic_forward, metamorphic_loss
from .selection import SELECTIONS, select
from .worst_of_k import OCCLUDERS, Followups, WorstOfK, jsonable, recreate_followup, scaled_for_scoring

__all__ = [
    "DIVERGENCES",
    "MIXES",
    "OBJECTIVES",
    "OCCLUDERS",
    "SELECTIONS",
    "ChainSampler",
    "Followups",
    "WorstOfK",
    "divergence",
    "jsonable",
    "metamorphic_forward",
    "metamorphic_loss",
    "probabilities",
    "ramp",
    "recreate_followup",
    "scaled_for_scoring",
    "select",
    "soft_dice_loss",
]
