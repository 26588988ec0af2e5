"""One module per run-directory file: its name, schema, atomic writer and reader.

``history`` (history.csv), ``efr`` (efr.csv), ``mr_cases`` (mr_cases.csv), ``corner_cases``
(corner_cases.json) and ``failures`` (failures/failures.jsonl). Writers are the callbacks; reporting,
``robusttrain corners`` and ``robusttrain report`` read only through these modules, and they read only
through :mod:`~robusttrain.rundir.paths` (no symlinks, nothing outside the run directory, torn rows
and garbage bytes refused with :class:`~robusttrain.rundir.paths.RunDirFileError`). Readers return
``None`` when the file is missing (so a report degrades section by section). ``lock`` is the
run-directory lock.

>>> import tempfile
>>> from robusttrain.rundir import history
>>> history.read(tempfile.mkdtemp()) is None
True
"""
from . import corner_cases, efr, failures, history, mr_cases

__all__ = ["corner_cases", "efr", "failures", "history", "mr_cases"]
