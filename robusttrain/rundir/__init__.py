"""One module per run-directory file: its name, schema, atomic writer and reader.

``history`` (history.csv), ``efr`` (efr.csv), ``mr_cases`` (mr_cases.csv), ``corner_cases``
(corner_cases.json), ``balanced_average`` (balanced_average.json) and ``failures`` (failures/failures.jsonl). Writers are the callbacks; reporting,
``robusttrain corners`` and ``robusttrain report`` read only through these modules. Readers return
``None`` when the file is missing or unreadable (so a report degrades section by section).

>>> import tempfile
>>> from robusttrain.rundir import history
>>> history.read(tempfile.mkdtemp()) is None
True
"""
from . import balanced_average, corner_cases, efr, failures, history, mr_cases

__all__ = ["balanced_average", "corner_cases", "efr", "failures", "history", "mr_cases"]
