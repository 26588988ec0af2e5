"""No command connects outward: every CLI command runs with outbound connections made to fail, still
succeeds, and made no attempt (each one recorded).

A ``sitecustomize.py`` injected through PYTHONPATH patches ``socket.socket.connect``/``connect_ex``
and ``socket.getaddrinfo`` in the subprocess: a connection to anything but loopback or a Unix socket,
and any name lookup other than localhost, is written to a log and refused. The environment carries
neither ``NO_ALBUMENTATIONS_UPDATE`` nor ``WANDB_MODE``, so robusttrain's own defaults are what is
tested (the fit uses ``logger=wandb``: W&B offline by default). Limit: only Python-level sockets are
seen (W&B's compiled service process is not; offline mode gives it nothing to send).
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[2]
SITECUSTOMIZE = r"""
import os, socket

_LOG = os.environ["NET_ATTEMPTS_LOG"]
_LOCAL = {"localhost", "127.0.0.1", "::1", "0.0.0.0", "", None}


def _record(what):
    with open(_LOG, "a") as fh:
        fh.write(f"{os.getpid()} {what}\n")


def _outward(sock, address):
    if sock.family == getattr(socket, "AF_UNIX", None):
        return False
    host = address[0] if isinstance(address, tuple) else address
    return host not in _LOCAL and not str(host).startswith("127.")


_connect, _connect_ex, _getaddrinfo = socket.socket.connect, socket.socket.connect_ex, socket.getaddrinfo


def connect(self, address):
    if _outward(self, address):
        _record(f"connect {address!r}")
        raise OSError(101, "outbound connections are disabled in this test")
    return _connect(self, address)


def connect_ex(self, address):
    if _outward(self, address):
        _record(f"connect_ex {address!r}")
        return 101
    return _connect_ex(self, address)


def getaddrinfo(host, *args, **kwargs):
    if host not in _LOCAL and not str(host).startswith("127."):
        _record(f"getaddrinfo {host!r}")
        raise socket.gaierror(-2, "name lookups are disabled in this test")
    return _getaddrinfo(host, *args, **kwargs)


socket.socket.connect, socket.socket.connect_ex, socket.getaddrinfo = connect, connect_ex, getaddrinfo
"""
TINY = [
    "recipe=smoke",
    "data.n_train=8",
    "data.n_val=4",
    "data.image_size=32",
    "data.batch_size=4",
    "callbacks.metamorphic.max_cases=4",
    "callbacks.mining.train_probe_size=4",
    "callbacks.metamorphic.suite.perturbations=[blur,contrast]",
    "trainer.enable_progress_bar=false",
]


@pytest.fixture
def offline(tmp_path):
    site = tmp_path / "site"
    site.mkdir()
    (site / "sitecustomize.py").write_text(SITECUSTOMIZE)
    log = tmp_path / "attempts.log"
    env = {k: v for k, v in os.environ.items() if k not in ("NO_ALBUMENTATIONS_UPDATE", "WANDB_MODE")}
    env.update(PYTHONPATH=f"{site}{os.pathsep}{ROOT}", NET_ATTEMPTS_LOG=str(log), OMP_NUM_THREADS="1")

    def run(*args: str) -> subprocess.CompletedProcess:
        return subprocess.run(
            [sys.executable, *args], capture_output=True, text=True, env=env, cwd=tmp_path, timeout=600
        )

    run.log = log
    return run


def test_the_harness_sees_an_outward_connection(offline):
    # the check can fail: a plain connection attempt, and Albumentations' update check without the opt-out
    proc = offline(
        "-c",
        "import socket\ntry: socket.create_connection(('example.org', 80), timeout=2)\n"
        "except OSError: pass\nimport albumentations",
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    attempts = offline.log.read_text()
    assert "example.org" in attempts
    assert attempts.count("\n") >= 2, attempts  # albumentations' PyPI check was attempted too


def test_every_command_runs_without_network(offline, tmp_path):
    run = tmp_path / "run"
    ckpt = run / "checkpoints" / "last.ckpt"
    commands = [
        ["fit", *TINY, f"run_dir={run}", "trainer.max_epochs=1", "logger=wandb"],
        ["validate", *TINY, f"run_dir={run}", "ckpt=last"],
        ["test", *TINY, f"run_dir={run}", "ckpt=last"],
        ["check", *TINY, f"run_dir={run}", f"ckpt={ckpt}"],
        ["corners", str(run)],
        ["gallery", "recipe=smoke", f"out={tmp_path / 'g.png'}", "n=1"],
        ["report", str(run)],
    ]
    for argv in commands:
        proc = offline("-m", "robusttrain", *argv)
        assert proc.returncode == 0, f"{argv[0]}: {proc.stderr[-3000:]}"
        assert not offline.log.exists(), f"{argv[0]} tried the network:\n{offline.log.read_text()}"
    assert (run / "wandb").is_dir() and list((run / "wandb").glob("offline-run-*"))  # W&B ran, offline
    assert (run / "report.html").is_file() and (tmp_path / "g.png").is_file()
