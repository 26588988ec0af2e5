"""No committed file names a folder of the machine it was made on (issue 47): docs, scripts and the
evidence archives (inside their .gz too) say paths relative to the repository, the data root ($DATA_ROOT,
``../shared/data``) or the run folder. Kept verbatim: the device machine's raw logs (docs/gpu_runs/)."""

import gzip
import re
import subprocess
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
ANYWHERE = re.compile(rb"(?<![\w.])/(?:work|home|root|Users)/")  # a home or workspace of some machine
IN_DOCS = re.compile(rb"(?<![\w.])/tmp/")  # a temp folder in a record is a path nobody else has
RAW_LOGS = "docs/gpu_runs/"


def _tracked() -> list[str]:
    try:
        out = subprocess.run(["git", "ls-files"], cwd=REPO, capture_output=True, text=True, check=True).stdout
    except (OSError, subprocess.CalledProcessError):
        pytest.skip("not a git checkout")
    return [
        f for f in out.splitlines() if not f.startswith(RAW_LOGS) and f != "tests/test_no_machine_paths.py"
    ]


def test_no_committed_file_names_a_machine_path():
    found = []
    for name in _tracked():
        path = REPO / name
        if not path.is_file():  # deleted in the working tree, or a submodule
            continue
        data = path.read_bytes()
        if name.endswith(".gz"):
            data = gzip.decompress(data)
        elif b"\0" in data[:4096]:  # binary (images, weights): no text paths to speak of
            continue
        for pattern in (ANYWHERE, IN_DOCS) if name.startswith("docs/") else (ANYWHERE,):
            m = pattern.search(data)
            if m:
                found.append(f"{name}: {data[max(0, m.start() - 40) : m.end() + 40]!r}")
    assert not found, "machine paths in committed files:\n" + "\n".join(found)


def test_no_committed_file_is_over_1_mib():
    """Data and weights of that size belong beside the repository (../shared/data, a grid's output), not in
    it: the evidence archives keep larger weights out by size and sha256 (benchmarks/evidence/archive.py)."""
    from benchmarks.evidence.archive import MAX_FILE_BYTES

    big = [f for f in _tracked() if (REPO / f).is_file() and (REPO / f).stat().st_size > MAX_FILE_BYTES]
    assert not big, f"files over {MAX_FILE_BYTES} bytes are tracked: {big}"
