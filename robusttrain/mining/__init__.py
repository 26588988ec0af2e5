"""robusttrain.mining: failure bank, replay datasets and failure-driven sampling (no Lightning)."""

from .bank import FailureBank
from .replay import CleanDataset, RandomPerturbationDataset, ReplayDataset
from .sampling import FailureDrivenWeights, rates_from_efr

__all__ = [
    "FailureBank",
    "CleanDataset",
    "RandomPerturbationDataset",
    "ReplayDataset",
    "FailureDrivenWeights",
    "rates_from_efr",
]
