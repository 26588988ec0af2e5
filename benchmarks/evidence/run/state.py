"""One (condition, seed) run as the protocol steps fill it in."""

from __future__ import annotations

import argparse
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any


@dataclass
class RunState:
    """One (condition, seed) run as the protocol steps fill it in: :func:`train_run` sets the data,
    callbacks, model and trainer; :func:`pick_checkpoints` the validation picks and weight averages;
    :func:`score_heldout` the held-out Dice of every pick; :func:`score_mr` the MR suite's follow-ups;
    :func:`write_run` turns it into ``result.json`` and the run's artifacts."""

    cond: str
    seed: int
    args: argparse.Namespace
    run_dir: Path
    v3: bool
    v4: bool  # v4 or later: the held-out family sets, per-follow-up archive, fp16 weights
    device: str
    v5: bool = False  # Evidence v5: the condition picks the model; EMA scored beside least_loss
    resume_from: str | None = None
    # train_run
    dm: Any = None
    held: dict = field(default_factory=dict)
    names: list = field(default_factory=list)
    n_train_cases: int = 0
    n_val_cases: int = 0
    sevs: tuple = ()
    mt: dict | None = None
    cbs: list = field(default_factory=list)
    test_fams: list = field(default_factory=list)
    v4_sets: dict = field(default_factory=dict)
    feats: tuple = ()
    rec: Any = None
    ema: Any = None
    model: Any = None
    trainer: Any = None
    train_s: float = 0.0
    # pick_checkpoints
    cols: list = field(default_factory=list)
    losses: dict = field(default_factory=dict)
    least: int = -1
    trade: Any = None
    choices: dict = field(default_factory=dict)
    cohort: Any = None
    extra_weights: dict = field(default_factory=dict)
    averages: dict = field(default_factory=dict)
    # score_heldout
    t1: float = 0.0
    need: list = field(default_factory=list)
    held_rows: Any = None
    picks: dict = field(default_factory=dict)
    # score_mr
    suite: Any = None
    efr_pols: list = field(default_factory=list)
    mr_by: dict = field(default_factory=dict)
    mr: dict = field(default_factory=dict)
    consistency: float = 0.0
    followups: list = field(default_factory=list)
    # score_curve (v5)
    curve: dict = field(default_factory=dict)
