"""End-of-fit weights files of the averaging callbacks: written atomically under the product's temp pattern.

``save_weights(trainer, dst)`` writes a weights-only Lightning checkpoint of the trainer's module to a
temp name of :data:`robusttrain.io.TMP_PATTERN` (``.<name>.<8 chars>.robusttrain.tmp``, the only names
the run-directory clean-up removes) beside ``dst`` and renames it: a kill leaves the previous file or
the new one, never a torn one, and the leftover temp file is removed by the next command. It passes the
kill point ``write:<dst name>`` between the two, as every atomic write of the product does.
"""

from __future__ import annotations

import contextlib
import os
import secrets
from pathlib import Path
from typing import Any

from robusttrain.io import TMP_SUFFIX, kill_point


def temp_name(dst: Path) -> Path:
    """A fresh temp path for ``dst`` matching :data:`robusttrain.io.TMP_PATTERN`.

    >>> from robusttrain.io import TMP_PATTERN
    >>> bool(TMP_PATTERN.match(temp_name(Path("run/ema.ckpt")).name))
    True
    """
    return dst.with_name(f".{dst.name}.{secrets.token_hex(4)}{TMP_SUFFIX}")


def save_weights(trainer: Any, dst: str | os.PathLike) -> Path:
    """``trainer.save_checkpoint(weights_only=True)`` to ``dst`` through a temp name (collective: every
    rank calls it, rank 0 writes). No callback's ``on_save_checkpoint`` runs for a weights-only
    checkpoint, so the file holds the module's weights as they are now."""
    dst = Path(dst)
    tmp = temp_name(dst)
    try:
        trainer.save_checkpoint(tmp, weights_only=True)
        if trainer.is_global_zero:
            kill_point(f"write:{dst.name}")
            os.replace(tmp, dst)
    except BaseException:
        if trainer.is_global_zero:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(tmp)
        raise
    return dst
