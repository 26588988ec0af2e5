"""Where ``check`` writes, what its checkpoint's training run trained on, and what it says first.

A checkpoint inside a ``fit`` run directory (``RUN/checkpoints/last.ckpt``, ``RUN/balanced.ckpt``) is checked
into that run, ``RUN/checks/<name>/`` (:mod:`robusttrain.rundir.check`), so ``report RUN`` shows the training
side and the held-out families on one page; ``run_dir=`` naming a fit's run directory does the same, any other
``run_dir=`` is a check-only run directory. The run's ``config.yaml`` and ``metamorphic_training.csv`` say which
families it trained on: those are never labelled held out (:func:`robusttrain.metamorphic.heldout.label_heldout`).

>>> import tempfile, pathlib
>>> run = pathlib.Path(tempfile.mkdtemp()); (run / "checkpoints").mkdir(); _ = (run / "config.yaml").write_text("seed: 0\\n")
>>> training_run(run / "checkpoints" / "last.ckpt") == run, training_run(run / "x.ckpt") == run, training_run(run.parent / "x.ckpt")
(True, True, None)
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from robusttrain.cli.errors import UsageError
from robusttrain.io import atomic_write_csv, atomic_write_text
from robusttrain.metamorphic.audit import long_table
from robusttrain.rundir import check as check_file
from robusttrain.rundir import efr as efr_file
from robusttrain.rundir.layout import CONFIG, EFR_TABLE_MD


def training_run(ckpt: Path) -> Path | None:
    """The ``fit`` run directory holding ``ckpt`` (its folder or the one above, with a ``config.yaml``)."""
    for d in (ckpt.parent, ckpt.parent.parent):
        if (d / CONFIG).is_file() and not (d / CONFIG).is_symlink():
            return d
    return None


def output_dir(
    run_dir: str | None, ckpt: Path, name: str | None, data_root: str | None, split: str
) -> tuple[str | None, Path | None]:
    """(the ``run_dir`` the check writes to -- None: the default ``runs/<recipe>/<time>/`` --, the training run
    it writes into, if any). ``name``: ``name=`` (validated), else :func:`robusttrain.rundir.check.check_name`."""
    if name is not None and not check_file.valid_name(name):
        raise UsageError(
            f"bad value for 'name': {name!r} (expected a folder name: letters, digits, '.', '_', '-', "
            "not starting with '.', at most 100 characters)"
        )
    folder = name or check_file.check_name(ckpt.stem, data_root, split)
    if run_dir:
        given = Path(run_dir).expanduser()
        if (given / CONFIG).is_file():  # a fit's run directory: the check goes beside its training files
            return str(given / check_file.DIR / folder), given
        if name is not None:
            raise UsageError(
                f"name= names the check's folder inside a training run (RUN/checks/NAME/); run_dir='{run_dir}' "
                "is not one (no config.yaml): drop name= or point run_dir= at a training run"
            )
        return str(given), None
    run = training_run(ckpt)
    if run is None:
        return None, None
    if not os.access(run, os.W_OK):
        print(
            f"[robusttrain] check: the training run {run} is not writable; writing to a new run directory "
            "(run_dir= chooses one)",
            flush=True,
        )
        return None, None
    return str(run / check_file.DIR / folder), run


def hold_run(run: Path, out_dir: str, explicit: bool) -> str | None:
    """Lock the training run ``out_dir`` lies in, for the check (a fit there must not replace or remove the
    check's folder while it writes, nor a check write while a fit holds it). A run in use by another
    command: refused when ``run_dir=`` named it (``explicit``), else the check goes to a new run directory
    (returns None) and one line says why."""
    from robusttrain.rundir import lock

    try:
        lock.hold(run, "check")
    except lock.RunDirBusyError as e:
        if explicit:
            raise UsageError(str(e)) from None
        print(
            f"[robusttrain] check: not writing into the training run: {e}; writing to a new run directory",
            flush=True,
        )
        return None
    except lock.InputError as e:
        raise UsageError(str(e)) from None
    return out_dir


def run_config(run: Path | None) -> dict[str, Any] | None:
    """The training run's ``config.yaml`` as plain values (``yaml.safe_load``: nothing is instantiated)."""
    import yaml

    from robusttrain.cli.tools import yaml_error_line
    from robusttrain.rundir.paths import read_text

    if run is None:
        return None
    try:
        cfg = yaml.safe_load(read_text(run, CONFIG) or "")
    except yaml.YAMLError as e:
        raise UsageError(yaml_error_line(run / CONFIG, e)) from None
    return cfg if isinstance(cfg, dict) else None


def trained_families(run: Path | None) -> dict[str, str]:
    """``{family: why}`` for what the training run trained on: its settings and its records."""
    from robusttrain.metamorphic.heldout import trained_by_config, trained_by_records
    from robusttrain.rundir.metamorphic_training import read_stats

    if run is None:
        return {}
    try:
        out = trained_by_config(run_config(run))
    except ValueError as e:
        raise UsageError(f"'{run / CONFIG}': bad {e}") from None
    for fam, why in trained_by_records(read_stats(run)).items():
        out[fam] = why  # the records are the stronger evidence: they say it was drawn
    return out


def first_line(n_cases: dict[str, int], n_empty: dict[str, int], empty: Any) -> str:
    """The line the check's results open with: cases scored per dataset and the empty-mask ones kept apart.

    >>> import pandas as pd
    >>> e = pd.DataFrame({"split": ["val"], "perturbation": ["clean"], "cases": [2], "predicted_nothing": [1]})
    >>> first_line({"val": 6}, {"val": 2}, e)
    '[robusttrain] check: val: 6 cases with a lesion scored; 2 with an empty mask (no lesion) kept out of the Dice means and the EFR -- clean specificity 50.0 % (1 of 2 predicted nothing)'
    """
    parts = []
    for name, n in n_cases.items():
        k = n_empty.get(name, 0)
        text = f"{name}: {n} cases with a lesion scored"
        if k:
            row = empty[(empty["split"] == name) & (empty["perturbation"] == "clean")]
            nothing = int(row["predicted_nothing"].iloc[0]) if len(row) else 0
            text += (
                f"; {k} with an empty mask (no lesion) kept out of the Dice means and the EFR -- clean "
                f"specificity {100 * nothing / k:.1f} % ({nothing} of {k} predicted nothing)"
            )
        else:
            text += "; none with an empty mask"
        parts.append(text)
    return "[robusttrain] check: " + " | ".join(parts)


def write_audit(out_dir: str | os.PathLike, out: dict[str, Any]) -> None:
    """An :func:`~robusttrain.metamorphic.audit.audit`'s files in ``out_dir``: ``efr_table.csv`` (column
    ``threshold`` + the wide table), ``efr_table.md`` (which says how many cases each table rests on) and the
    three per-case tables of :mod:`robusttrain.rundir.check`."""
    atomic_write_csv(Path(out_dir) / efr_file.TABLE_NAME, long_table(out["tables"]))
    atomic_write_text(Path(out_dir) / EFR_TABLE_MD, out["markdown"])
    for file, key in (
        (check_file.CASES, "per_case"),
        (check_file.FOLLOWUPS, "followups"),
        (check_file.EMPTY, "empty"),
    ):
        check_file.write(out_dir, file, out[key])
