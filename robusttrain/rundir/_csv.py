"""Shared CSV reading for the run-directory modules."""
from __future__ import annotations

import logging
from pathlib import Path

import pandas as pd

log = logging.getLogger(__name__)


def read_csv(path: Path) -> pd.DataFrame | None:
    """The table, or None when the file is missing, empty or unreadable (logged)."""
    if not path.is_file():
        return None
    try:
        frame = pd.read_csv(path)
    except (pd.errors.EmptyDataError, pd.errors.ParserError, OSError) as err:
        log.warning("cannot read %s: %s", path, err)
        return None
    return frame if len(frame) else None
