"""Lightning callbacks: the only part of robusttrain that knows about hooks, ranks and checkpoints.

``MetamorphicCallback`` runs the MR suite after validation, ``BalancedCheckpoint`` picks the
checkpoint that does not sacrifice corner cases, ``FailureMiningCallback`` replays MR failures as
training data and ``RobustnessReporter`` draws the curves (PNG, W&B). Put them in this order.
"""
from .metamorphic import MetamorphicCallback
from .balanced_checkpoint import BalancedCheckpoint
from .failure_mining import FailureMiningCallback
from .reporting import RobustnessReporter

__all__ = ["MetamorphicCallback", "BalancedCheckpoint", "FailureMiningCallback", "RobustnessReporter"]
