"""A CSV logger whose ``metrics.csv`` survives a resume and a kill.

Lightning's ``CSVLogger`` deletes an existing ``metrics.csv`` when it starts in the same folder
(so ``fit ckpt=last`` lost the history of the epochs before the kill) and writes the file in place
(a kill mid-write leaves it torn). This one keeps the existing rows, writes every logged row at once
(appends; the whole file atomically when the header grows) and, on resume, drops the rows of the
epochs the resumed run will log again (:meth:`CSVLogger.resume_after`), so nothing is duplicated.

>>> import tempfile
>>> d = tempfile.mkdtemp()
>>> log = CSVLogger(d, name="logs", version="")
>>> log.log_metrics({"val/dice": 0.5, "epoch": 0}, step=3)
>>> log2 = CSVLogger(d, name="logs", version="")    # a resumed run in the same folder
>>> log2.log_metrics({"val/dice": 0.6, "epoch": 1}, step=7)
>>> print(open(d + "/logs/metrics.csv").read().strip())
epoch,step,val/dice
0,3,0.5
1,7,0.6
"""

from __future__ import annotations

import csv
import io
import os
from typing import Any, cast

from lightning.pytorch.loggers import CSVLogger as _LightningCSVLogger
from lightning.pytorch.loggers.csv_logs import ExperimentWriter
from lightning.pytorch.loggers.logger import rank_zero_experiment

from robusttrain.io import atomic_write_text, kill_point


class _KeepingWriter(ExperimentWriter):
    """Lightning's writer without the deletion; every ``log_metrics`` reaches the file."""

    def __init__(self, log_dir: str) -> None:
        super().__init__(log_dir)
        self._header, self._rows = _read(self.metrics_file_path)
        self.metrics_keys = list(self._header)

    def _check_log_dir_exists(self) -> None:  # Lightning deletes metrics.csv here
        pass

    def log_metrics(self, metrics_dict: dict[str, float], step: int | None = None) -> None:
        super().log_metrics(metrics_dict, step)
        self.save()  # a killed run keeps everything it logged

    def save(self) -> None:
        if not self.metrics:
            return
        kill_point("log:metrics.csv")
        self._record_new_keys()
        rows, self.metrics = self.metrics, []
        if self.metrics_keys == self._header and os.path.isfile(self.metrics_file_path):
            with open(self.metrics_file_path, "a", newline="") as fh:
                fh.write(_format(self._header, rows, header_line=False))
        else:  # a new metric: the header grows, every row is rewritten (atomically)
            self._header = list(self.metrics_keys)
            atomic_write_text(self.metrics_file_path, _format(self._header, self._rows + rows))
        self._rows.extend(rows)

    def drop_epochs_after(self, epoch: int) -> int:
        """Remove rows with ``epoch`` > ``epoch``; returns how many were removed."""
        keep = [r for r in self._rows if not _epoch_after(r, epoch)]
        n = len(self._rows) - len(keep)
        if n:
            self._rows = keep
            atomic_write_text(self.metrics_file_path, _format(self._header, keep))
        return n


def _epoch_after(row: dict[str, Any], epoch: int) -> bool:
    try:
        return float(row.get("epoch", "")) > epoch
    except (TypeError, ValueError):
        return False


def _read(path: str) -> tuple[list[str], list[dict[str, Any]]]:
    if not os.path.isfile(path):
        return [], []
    with open(path, newline="") as fh:
        text = fh.read()
    if text and not text.endswith("\n"):  # a torn last line from a killed write
        text = text[: text.rfind("\n") + 1]
    reader = csv.DictReader(io.StringIO(text))
    return list(reader.fieldnames or []), list(reader)


def _format(header: list[str], rows: list[dict[str, Any]], header_line: bool = True) -> str:
    buf = io.StringIO()
    writer = csv.DictWriter(buf, fieldnames=header, lineterminator="\n")
    if header_line:
        writer.writeheader()
    writer.writerows(rows)
    return buf.getvalue()


class CSVLogger(_LightningCSVLogger):
    """Lightning's ``CSVLogger`` that keeps and appends to an existing ``metrics.csv`` (module doc)."""

    @property
    @rank_zero_experiment
    def experiment(self) -> _KeepingWriter:
        if self._experiment is None:
            self._fs.makedirs(self.root_dir, exist_ok=True)
            self._experiment = _KeepingWriter(log_dir=self.log_dir)
        return cast(_KeepingWriter, self._experiment)  # only this class ever sets it

    def resume_after(self, epoch: int) -> int:
        """Forget rows of epochs after ``epoch`` (a resumed run logs them again); returns the count."""
        from lightning.pytorch.utilities.rank_zero import rank_zero_only

        return self.experiment.drop_epochs_after(epoch) if getattr(rank_zero_only, "rank", 0) == 0 else 0
