"""Who owns the run directory: one command at a time (a lock), which files each command writes,
and what a ``fit`` may find there before it starts.

* ``fit`` owns the training files (:data:`FIT_OUTPUTS`). ``validate``, ``test`` and ``check``
  pointed at the same ``run_dir`` write beside them (``config.<command>.yaml``, ``logs/<command>/``).
* The lock is :mod:`robusttrain.rundir.lock` (OS-level; the callbacks take the same one in the API).
  A second command on a run directory in use is refused (exit 2). When the previous owner was
  killed, its temp files (:func:`robusttrain.rundir.layout.is_temp`, only in robusttrain's own folders
  of the run directory) are removed and a message says so.
* A fresh ``fit`` (no ``ckpt=``) into a run directory that holds anything is refused, unless
  ``overwrite=true`` (which removes robusttrain's own files there -- :mod:`robusttrain.rundir.layout`'s
  list --, nothing else) or the previous fit there stopped (killed, or in order) before it saved
  ``checkpoints/last.ckpt``: nothing to resume, so ``fit`` and ``fit ckpt=last`` start clean, with the
  earlier files moved to ``before-<time>/`` (:func:`start_clean`).
* Under DDP the other ranks re-run the command in child processes (``LOCAL_RANK``/``NODE_RANK`` set):
  rank 0 holds the lock for all of them.
"""

from __future__ import annotations

import os
import shutil
import sys
from pathlib import Path

from robusttrain.cli.errors import UsageError
from robusttrain.rundir import layout, lock

# robusttrain's own names in a run directory: the one list (robusttrain.rundir.layout)
FIT_OUTPUTS = layout.own_names()
TMP_FOLDERS = layout.TEMP_FOLDERS
FOLDERS = layout.folder_names()


def config_name(command: str) -> str:
    """The resolved-config file a command writes: ``config.yaml`` for fit, else ``config.<command>.yaml``."""
    return "config.yaml" if command == "fit" else f"config.{command}.yaml"


def logger_version(command: str) -> str:
    """Loggers' ``version`` (sub-folder): fit logs to ``logs/``, others to ``logs/<command>/``."""
    return "" if command == "fit" else command


def is_child_rank() -> bool:
    """True in the processes Lightning starts for DDP ranks > 0 (they share rank 0's run dir)."""
    return os.environ.get("LOCAL_RANK", "0") != "0" or os.environ.get("NODE_RANK", "0") != "0"


def is_own_temp(path: Path) -> bool:
    """A temp name robusttrain writes (:func:`robusttrain.rundir.layout.is_temp`), ``path`` relative
    to the run directory.

    >>> is_own_temp(Path(".history.csv.ab12_xyZ.robusttrain.tmp")), is_own_temp(Path(".notes.txt.tmp"))
    (True, False)
    >>> is_own_temp(Path(".ema.ckpt.tmp")), is_own_temp(Path("balanced_candidates/.epoch=0001.ckpt.tmp"))
    (True, True)
    """
    return layout.is_temp(path)


def remove_stale_temp_files(run_dir: str | os.PathLike) -> int:
    """Delete the temp files a killed run left: only robusttrain's names, only in its own folders."""
    n = 0
    for sub in TMP_FOLDERS:
        folder = Path(run_dir) / sub
        if not folder.is_dir() or folder.is_symlink():
            continue
        for p in folder.iterdir():
            if is_own_temp(Path(sub) / p.name) and p.is_file() and not p.is_symlink():
                p.unlink(missing_ok=True)
                n += 1
    return n


def _say(text: str) -> None:
    print(text, file=sys.stderr, flush=True)


def claim(run_dir: Path, command: str) -> None:
    """Lock ``run_dir`` for ``command`` (rank 0 only) and clean up after an interrupted run.

    Called before anything is written into the run directory; released when the command ends.
    """
    if is_child_rank():
        return
    try:
        held = lock.hold(run_dir, command)
    except lock.InputError as e:
        raise UsageError(str(e)) from None
    owner = held.interrupted
    if owner is not None and not getattr(held, "announced", False):
        held.announced = True
        _say(
            f"[robusttrain] run_dir {run_dir}: took over the lock of an interrupted run "
            f"(pid {owner.get('pid', '?')}, {owner.get('command', '?')} since {owner.get('since', '?')}, "
            "no longer running)"
        )
    for sub in FOLDERS:  # found now, not after the whole training (a file named `plots`)
        p = run_dir / sub
        if p.exists() and not p.is_dir():
            raise UsageError(
                f"'{p}' is a file where robusttrain writes a folder; move it away or use another run_dir"
            )
    n = remove_stale_temp_files(run_dir)
    if n:
        _say(f"[robusttrain] run_dir {run_dir}: removed {n} temporary file(s) left by an interrupted run")


def _contents(run_dir: Path) -> list[str]:
    return sorted(p.name for p in run_dir.iterdir() if p.name not in (lock.LOCK_NAME, lock.OWNER_NAME))


def _remove_outputs(run_dir: Path) -> list[str]:
    gone = []
    for p in layout.own_paths(run_dir):
        if p.is_symlink() or p.is_file():
            p.unlink()
        elif p.is_dir():
            shutil.rmtree(p)
        gone.append(p.name)
    return gone


def starts_clean(run_dir: Path) -> bool:
    """True when a fit began in ``run_dir`` and saved no ``checkpoints/last.ckpt``: nothing to resume.

    A kill leaves the fit's owner record (:mod:`robusttrain.rundir.lock`); a stop in order (SIGTERM,
    Ctrl-C), or a kill whose record a later command has cleared, leaves the fit's ``config.yaml``
    and no checkpoint at all."""
    if is_child_rank():
        return False
    ckpts = run_dir / layout.CHECKPOINTS
    if ckpts.is_dir() and any(ckpts.glob("last*.ckpt")):
        return False
    owner = lock.hold(run_dir, "fit").interrupted
    if owner is not None and owner.get("command") == "fit":
        return True
    return (run_dir / layout.CONFIG).is_file() and not (ckpts.is_dir() and any(ckpts.glob("*.ckpt")))


def start_clean(run_dir: Path) -> None:
    """A fit that stopped before its first checkpoint (:func:`starts_clean`): its files go to
    ``before-<time>/`` (kept, said in one line) and the new fit starts in an empty run directory."""
    dest, moved = layout.set_aside(run_dir, FIT_OUTPUTS)
    kept = f"; its files ({', '.join(moved)}) moved to {dest.name}/" if dest is not None else ""
    _say(
        f"[robusttrain] run_dir {run_dir}: the fit there stopped before its first checkpoint (nothing to "
        f"resume); starting clean{kept}"
    )


def prepare_fresh_fit(run_dir: Path, overwrite: bool) -> None:
    """A ``fit`` without ``ckpt=``: refuse a run directory with content, or empty it (see module doc)."""
    if is_child_rank() or not (found := _contents(run_dir)):
        return
    if overwrite:
        gone = _remove_outputs(run_dir)
        _say(f"[robusttrain] run_dir {run_dir}: overwrite=true: removed {', '.join(gone) or 'nothing'}")
    elif starts_clean(run_dir):
        start_clean(run_dir)
    else:
        shown = ", ".join(found[:5]) + (f" and {len(found) - 5} more" if len(found) > 5 else "")
        if not any((run_dir / layout.CHECKPOINTS).glob("*.ckpt")):
            # no fit's config.yaml either: files of the user's own (robusttrain's would be set aside)
            raise UsageError(
                f"run_dir '{run_dir}' is not empty ({shown}) but holds no checkpoint: nothing was "
                "trained there yet; pass overwrite=true to start over (it replaces robusttrain's "
                "files there), or use another run_dir"
            )
        raise UsageError(
            f"run_dir '{run_dir}' is not empty ({shown}); resume its fit with ckpt=last, "
            "use another run_dir, or pass overwrite=true to replace its robusttrain files"
        )


def release_all() -> None:
    """Release every lock this process holds (end of a command)."""
    lock.release_all()
