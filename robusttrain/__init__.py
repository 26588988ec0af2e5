"""robusttrain: robustness-aware training for medical image segmentation."""

import os as _os

# Nothing connects outward at run time: Albumentations checks PyPI for a newer version when it is
# imported unless this is set, and every robusttrain module imports before it does.
_os.environ.setdefault("NO_ALBUMENTATIONS_UPDATE", "1")

# before anything imports torchmetrics (which imports torchvision when installed): a torchvision built for
# another torch would otherwise break every import (see robusttrain/_torchvision.py)
from robusttrain import _torchvision  # noqa: E402

_torchvision.ensure()

__version__ = "0.1.0"
