"""One module per run-directory file: its name, schema, atomic writer and reader.

``history`` (history.csv), ``efr`` (efr.csv, efr_table.csv), ``mr_cases`` (mr_cases.csv), ``corner_cases``
(corner_cases.json), ``balanced_average`` (balanced_average.json), ``failures`` (failures/failures.jsonl),
``sampling`` (failures/sampling.json), ``mining`` (failures/mining.csv), ``resumes`` (resumes.jsonl: what
each resume of a CLI fit changed) and ``metamorphic_training``
(metamorphic_training.csv / _samples.jsonl); ``pretrained`` (pretrained.json) is written by ``fit``; ``check`` (what
``robusttrain check`` writes: ``checks/<name>/`` or a check-only run directory). Writers are the callbacks (and the bank); replay, reporting,
``robusttrain corners`` and ``robusttrain report`` read only through these modules, and they read only
through :mod:`~robusttrain.rundir.paths` (no symlinks, nothing outside the run directory, torn rows
and garbage bytes refused with :class:`~robusttrain.rundir.paths.RunDirFileError`). Readers return
``None`` when the file is missing (so a report degrades section by section). ``lock`` is the
run-directory lock. ``csv_table`` is the one CSV reader (torn rows refused) of every table here and of
``robusttrain corners``. ``layout`` is the one list of every name a run directory holds (files, folders,
temp names): ``fit overwrite=true``, the temp clean-up and the API's set-aside derive from it.

>>> import tempfile
>>> from robusttrain.rundir import history
>>> history.read(tempfile.mkdtemp()) is None
True
"""

from . import (
    balanced_average,
    check,
    corner_cases,
    efr,
    failures,
    history,
    layout,
    metamorphic_training,
    mining,
    mr_cases,
    pretrained,
    resumes,
    sampling,
)

__all__ = [
    "balanced_average",
    "check",
    "corner_cases",
    "efr",
    "failures",
    "history",
    "layout",
    "metamorphic_training",
    "mining",
    "mr_cases",
    "pretrained",
    "resumes",
    "sampling",
]
