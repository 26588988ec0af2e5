"""robusttrain.callbacks"""
from .metamorphic import MetamorphicCallback  # noqa: F401
from .balanced_checkpoint import BalancedCheckpoint  # noqa: F401
from .failure_mining import FailureMiningCallback  # noqa: F401
from .reporting import RobustnessReporter  # noqa: F401
