"""robusttrain: robustness-aware training for medical image segmentation."""

import os as _os

# Nothing connects outward at run time: Albumentations checks PyPI for a newer version when it is
# imported unless this is set, and every robusttrain module imports before it does.
_os.environ.setdefault("NO_ALBUMENTATIONS_UPDATE", "1")

__version__ = "0.1.0"
