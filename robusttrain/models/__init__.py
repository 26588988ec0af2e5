"""The recipes' default LightningModule. Nothing else in robusttrain depends on it."""

from robusttrain.models.networks import build_network
from robusttrain.models.segmentation import SegmentationModule

__all__ = ["SegmentationModule", "build_network"]
