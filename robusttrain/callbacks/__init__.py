"""robusttrain.callbacks"""
from .balanced_checkpoint import BalancedCheckpoint  # noqa: F401
