"""Where the benchmarks find the checkout and the data: no machine paths in the scripts.

``REPO`` is this checkout. ``DATA_ROOT`` is the shared data folder: the environment's ``DATA_ROOT``
when set, else ``<repo>/../shared/data`` (the layout of the development machine and of the device
copies). Every script that reads data also takes a ``--data-root`` / ``--root`` argument defaulting to it.
"""

from __future__ import annotations

import os
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def default_data_root() -> Path:
    """``$DATA_ROOT`` if set, else ``<repo>/../shared/data``."""
    env = os.environ.get("DATA_ROOT")
    return Path(env) if env else REPO.parent / "shared" / "data"


DATA_ROOT = default_data_root()
