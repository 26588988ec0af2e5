"""Shared pytest fixtures."""

import contextlib
import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]

if os.environ.get("PYTEST_XDIST_WORKER"):
    # `make test` runs two workers on a 2-core machine: one torch thread each (and in what they spawn),
    # so the workers do not fight over the cores; a plain `pytest` keeps torch's default
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    import torch

    torch.set_num_threads(1)
_CACHES = {".pytest_cache", "__pycache__", ".mypy_cache", ".ruff_cache", ".coverage", ".hypothesis"}


def _ignored_by_git(name: str) -> bool:
    try:
        r = subprocess.run(["git", "check-ignore", "-q", name], cwd=REPO, capture_output=True, timeout=30)
    except (OSError, subprocess.SubprocessError):
        return True  # no git here: nothing can be committed by accident either
    return r.returncode == 0


@pytest.fixture(scope="session", autouse=True)
def repository_root_stays_clean():
    """Nothing a test runs may write into the repository root. A trainer without ``default_root_dir``
    writes the robustness callbacks' files into the working directory; two such files were once
    committed by accident, so the whole session fails if a new entry appears that git does not ignore."""
    before = {p.name for p in REPO.iterdir()}
    yield
    new = sorted({p.name for p in REPO.iterdir()} - before - _CACHES)
    new = [n for n in new if not _ignored_by_git(n)]  # runs/, lightning_logs/ ...: cannot be committed
    if new:
        raise AssertionError(f"the test session wrote {new} into the repository root {REPO}")


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
