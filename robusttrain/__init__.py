"""robusttrain: robustness-aware training for medical image segmentation."""
__version__ = "0.1.0"
