"""What a run directory holds: the one list of its files, folders and temp names.

Every name robusttrain (or a logger it configures) writes into a run directory is an :class:`Entry`
of :data:`ENTRIES`; each run-directory module owns its file's name and this list imports it. What
depends on knowing the run directory derives from here, never from a copied list:

* ``fit overwrite=true`` and a fresh fit after a kill remove :func:`own_names` (``cli/claim.py``);
* the clean-up after a killed command removes :func:`is_temp` names in :data:`TEMP_FOLDERS`;
* a fresh fit in the API sets an earlier fit's :func:`result_names` aside (:func:`set_aside_results`), and
  a CLI fit finding one that stopped before its first checkpoint sets all of it aside (:func:`set_aside`);
* a file where robusttrain writes a folder is refused up front (:func:`folder_names`);
* the test that runs every callback fails when one writes a name :func:`known` does not know.

Temp names: the atomic writers' ``.<name>.<8 chars>.robusttrain.tmp`` (:data:`robusttrain.io.TMP_PATTERN`)
and ``.<name>.tmp`` of a listed file (the checkpoint writers save through ``trainer.save_checkpoint``
to that name, then rename: ``.ema.ckpt.tmp``, ``.balanced_average.ckpt.tmp``, ``.epoch=0003.ckpt.tmp``).

>>> known("history.csv"), known("balanced_average_window/epoch=0002.pt"), known("notes.txt")
(True, True, False)
>>> known("failures/thumbs", is_folder=True), known("plots/x.csv")
(True, False)
>>> known("checks/last-val", is_folder=True), known("checks/last-val/check_cases.csv")
(True, True)
>>> known("before-20261126-140312-000001", is_folder=True), known("before-notes", is_folder=True)
(True, False)
>>> is_temp(".ema.ckpt.tmp"), is_temp("balanced_candidates/.epoch=0003.ckpt.tmp"), is_temp(".notes.txt.tmp")
(True, True, False)
>>> "metamorphic_training.csv" in own_names() and "ema.ckpt" in result_names()
True
"""

from __future__ import annotations

import logging
import os
from dataclasses import dataclass
from datetime import datetime
from fnmatch import fnmatchcase
from pathlib import Path, PurePosixPath

from robusttrain.io import TMP_PATTERN

from . import (
    balanced_average,
    check,
    corner_cases,
    efr,
    ema,
    failures,
    history,
    lock,
    metamorphic_training,
    mining,
    mr_cases,
    pretrained,
    resumes,
    sampling,
)

log = logging.getLogger(__name__)

CONFIG = "config.yaml"
LOGS = "logs"
CHECKPOINTS = "checkpoints"
LAST_CKPT = "last.ckpt"
PLOTS = "plots"
REPORT = "report.html"
GALLERY = "gallery.png"
EFR_TABLE_MD = "efr_table.md"
BALANCED_CKPT = corner_cases.CHECKPOINT
CANDIDATES = "balanced_candidates"
EMA_CKPT = ema.CHECKPOINT
EARLIER = "before-"  # a fresh API fit's folder for an earlier fit's results: before-<time>/
STAMP = "[0-9]*-[0-9]*-[0-9]*"  # <time> as %Y%m%d-%H%M%S-%f: a user's `before-notes/` is not ours
COMMANDS = ("validate", "test", "check")  # write beside a fit: config.<command>.yaml, logs/<command>/
CHECK_FILES = (check.SUMMARY, check.CASES, check.FOLLOWUPS, check.EMPTY)
LOCK_FILES = (lock.LOCK_NAME, lock.OWNER_NAME)


@dataclass(frozen=True)
class Entry:
    """One top-level name of a run directory.

    ``name`` may be a glob (``before-*``); ``contents`` are globs of what a folder holds, relative to
    it (``"**"``: anything, for a folder whose writer is a logger library); ``result`` marks what a fit's
    callbacks write as its results (a fresh API fit sets an earlier fit's aside).
    """

    name: str
    writer: str
    folder: bool = False
    contents: tuple[str, ...] = ()
    result: bool = False

    def holds(self, inner: str) -> bool:
        return any(p == "**" or fnmatchcase(inner, p) for p in self.contents)


ENTRIES: tuple[Entry, ...] = (
    Entry(CONFIG, "fit (CLI): the resolved recipe"),
    Entry(pretrained.NAME, "fit (CLI): the pretrained weight file the network started from"),
    *(Entry(f"config.{c}.yaml", f"{c} (CLI): its resolved recipe") for c in COMMANDS),
    Entry(resumes.NAME, "fit ckpt=... (CLI): the settings each resume changed (config.yaml keeps the first)"),
    Entry(LOGS, "the loggers (CSV, TensorBoard); logs/<command>/ for validate, test, check", True, ("**",)),
    Entry("wandb", "the W&B logger (offline runs)", True, ("**",)),
    Entry(CHECKPOINTS, "Lightning's ModelCheckpoint: last.ckpt, epochNNN.ckpt", True, ("*.ckpt",)),
    Entry(history.NAME, "MetamorphicCallback: per-case clean scores", result=True),
    Entry(history.FALLBACK_NAME, "BalancedCheckpoint without an MR callback", result=True),
    Entry(efr.NAME, "MetamorphicCallback: error-finding rates", result=True),
    Entry(mr_cases.NAME, "MetamorphicCallback: per-case MR results", result=True),
    Entry(
        failures.DIR,
        "MetamorphicCallback / FailureMiningCallback: the failure bank",
        True,
        (failures.LOG_NAME, sampling.NAME, mining.NAME, mining.CONDITIONS, f"{failures.THUMB_DIR}/*.png"),
        result=True,
    ),
    Entry(corner_cases.NAME, "BalancedCheckpoint: corner cases and the chosen epoch", result=True),
    Entry(BALANCED_CKPT, "BalancedCheckpoint: the chosen epoch's checkpoint", result=True),
    Entry(
        corner_cases.PICKS_DIR,
        "BalancedCheckpoint: the epochs the other policies pick (policy_checkpoints of corner_cases.json)",
        True,
        ("epoch=*.ckpt",),
        True,
    ),
    Entry(
        CANDIDATES,
        "BalancedCheckpoint: per-epoch candidates until the fit ends",
        True,
        ("epoch=*.ckpt",),
        True,
    ),
    Entry(balanced_average.CHECKPOINT, "BalancedAverage: the averaged weights", result=True),
    Entry(balanced_average.NAME, "BalancedAverage: which epochs it averaged", result=True),
    Entry(
        balanced_average.WINDOW_DIR,
        "BalancedAverage: window snapshots until the fit ends",
        True,
        ("epoch=*.pt",),
        True,
    ),
    Entry(metamorphic_training.STATS, "MetamorphicTraining: drawn / kept per family and epoch", result=True),
    Entry(metamorphic_training.SAMPLES, "MetamorphicTraining: a sample of its follow-ups", result=True),
    Entry(EMA_CKPT, "EMACheckpoint: the EMA weights", result=True),
    Entry(ema.NAME, "EMACheckpoint: its decay and the window it gives", result=True),
    Entry(PLOTS, "RobustnessReporter: PNG curves", True, ("*.png",), result=True),
    Entry(efr.TABLE_NAME, "check (a check-only run directory): the EFR tables"),
    Entry(EFR_TABLE_MD, "check (a check-only run directory): the EFR tables as Markdown"),
    *(Entry(n, "check (a check-only run directory): see robusttrain.rundir.check") for n in CHECK_FILES),
    Entry(
        check.DIR,
        "check of this run's checkpoint: one folder per check (robusttrain.rundir.check)",
        True,
        tuple(
            f"*/{n}" for n in ("config.check.yaml", efr.TABLE_NAME, EFR_TABLE_MD, *CHECK_FILES, *LOCK_FILES)
        ),
        result=True,
    ),
    Entry(REPORT, "report: the HTML report"),
    Entry(GALLERY, "gallery out=RUN_DIR/gallery.png (the report shows it)"),
    Entry(f"{EARLIER}{STAMP}", "a fresh API fit: an earlier fit's results, set aside", True, ("**",)),
    Entry(
        f"{failures.DIR}.{EARLIER}{STAMP}",
        "FailureMiningCallback: an earlier run's bank, set aside",
        True,
        ("**",),
    ),
)

# where temp files are looked for after a kill (never recursively into anything else the folder holds)
TEMP_FOLDERS: tuple[str, ...] = (
    ".",
    *(e.name for e in ENTRIES if e.folder and "*" not in e.name),
    *(f"{LOGS}/{c}" for c in COMMANDS),
    f"{failures.DIR}/{failures.THUMB_DIR}",
)


def _entry(top: str) -> Entry | None:
    return next((e for e in ENTRIES if fnmatchcase(top, e.name)), None)


def own_names() -> tuple[str, ...]:
    """Every fixed top-level name robusttrain writes (what ``overwrite=true`` removes, with
    :func:`own_paths` for the globbed ones)."""
    return tuple(e.name for e in ENTRIES if "*" not in e.name)


def own_paths(run_dir: str | os.PathLike) -> list[Path]:
    """The entries present in ``run_dir`` (globbed names expanded), in list order."""
    root = Path(run_dir)
    out: list[Path] = []
    for e in ENTRIES:
        if "*" in e.name:  # a globbed name is ours only as the kind the list says (a folder)
            out += [p for p in sorted(root.glob(e.name)) if p.is_dir() == e.folder and not p.is_symlink()]
        else:
            out += [p for p in [root / e.name] if p.exists() or p.is_symlink()]
    return out


def result_names() -> tuple[str, ...]:
    """What a fit's callbacks write as its results."""
    return tuple(e.name for e in ENTRIES if e.result)


def folder_names() -> tuple[str, ...]:
    """Top-level names robusttrain writes as folders."""
    return tuple(e.name for e in ENTRIES if e.folder and "*" not in e.name)


def is_temp(rel: str | os.PathLike) -> bool:
    """True for a temp name robusttrain writes, at ``rel`` (relative to the run directory)."""
    parts = PurePosixPath(Path(rel).as_posix()).parts
    name = parts[-1] if parts else ""
    if TMP_PATTERN.match(name):
        return True
    if not (name.startswith(".") and name.endswith(".tmp")):
        return False
    target = name[1:-4]
    if len(parts) == 1:
        e = _entry(target)
        return e is not None and not e.folder
    folder = _entry(parts[0])
    inner = "/".join([*parts[1:-1], target])
    return folder is not None and folder.contents != ("**",) and folder.holds(inner)


def known(rel: str | os.PathLike, is_folder: bool = False) -> bool:
    """True when ``rel`` (a path relative to the run directory; ``is_folder``: a folder) is a name
    of the list."""
    parts = PurePosixPath(Path(rel).as_posix()).parts
    if not parts:
        return False
    if len(parts) == 1 and (parts[0] in LOCK_FILES or is_temp(parts[0])):
        return True
    e = _entry(parts[0])
    if e is None or (len(parts) == 1 and e.folder != is_folder):
        return False
    if len(parts) == 1:
        return True
    inner = "/".join(parts[1:])
    if not e.folder:
        return False
    if e.contents == ("**",):
        return True
    if is_folder:
        return any(fnmatchcase(inner, p.rsplit("/", 1)[0]) for p in e.contents if "/" in p)
    return e.holds(inner) or is_temp(rel)


def unknown_files(run_dir: str | os.PathLike) -> list[str]:
    """Every file or folder below ``run_dir`` that the list does not know (relative, sorted; folders
    end in ``/``)."""
    root = Path(run_dir)
    out = []
    for p in sorted(root.rglob("*")):
        rel = p.relative_to(root).as_posix()
        folder = p.is_dir() and not p.is_symlink()
        if not known(rel, folder):
            out.append(rel + ("/" if folder else ""))
    return out


def set_aside(run_dir: str | os.PathLike, names: tuple[str, ...]) -> tuple[Path | None, list[str]]:
    """Move the entries of ``run_dir`` named in ``names`` (fixed names of the list) to a new
    ``before-<time>/`` folder; returns it and the names moved (``(None, [])`` when none is there).
    Nothing is deleted: an earlier run's files stay readable there."""
    root = Path(run_dir)
    found = [p for p in own_paths(root) if p.name in names]
    if not found:
        return None, []
    dest = root / f"{EARLIER}{datetime.now().strftime('%Y%m%d-%H%M%S-%f')}"
    dest.mkdir()
    for p in found:
        os.replace(p, dest / p.name)
    return dest, [p.name for p in found]


def set_aside_results(run_dir: str | os.PathLike) -> Path | None:
    """A fresh fit in the API (no ``ckpt_path``) finding an earlier fit's results in its run directory
    moves them to ``before-<time>/`` and says so: a fit never silently replaces another's files. The
    CLI refuses such a directory instead (``fit overwrite=true`` replaces it)."""
    dest, moved = set_aside(run_dir, result_names())
    if dest is not None:
        log.warning(
            "robusttrain: %s held an earlier fit's files (%s); moved them to %s/ (a fresh fit never replaces "
            "another's results; resume that fit with trainer.fit(..., ckpt_path=...) to continue it)",
            Path(run_dir),
            ", ".join(moved),
            dest.name,
        )
    return dest
