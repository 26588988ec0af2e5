"""Shared pytest fixtures."""

import contextlib
import os
import subprocess
import sys
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


@pytest.fixture
def cpu_hog():
    """``with cpu_hog(n):`` runs ``n`` busy processes beside the block (a machine other jobs are using)."""

    @contextlib.contextmanager
    def hog(n: int = 2):
        procs = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(n)]
        try:
            yield
        finally:
            for p in procs:
                p.kill()
                p.wait()

    return hog
