"""Shared pytest fixtures."""

import os
from pathlib import Path

import pytest


@pytest.fixture(scope="session")
def shared_data() -> Path:
    """The shared sample data folder (``$ROBUSTTRAIN_SHARED_DATA`` or ``<repo>/../shared/data``), else skip."""
    env = os.environ.get("ROBUSTTRAIN_SHARED_DATA")
    path = Path(env) if env else Path(__file__).resolve().parents[2] / "shared" / "data"
    if not path.is_dir():
        pytest.skip(f"shared sample data not found at {path} (set ROBUSTTRAIN_SHARED_DATA)")
    return path
