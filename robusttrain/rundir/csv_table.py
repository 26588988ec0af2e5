"""Shared CSV reading for the run-directory modules: through the safe reader, torn rows refused."""

from __future__ import annotations

import csv
import io
import os

import pandas as pd

from .paths import RunDirFileError, read_text


def read_csv(run_dir: str | os.PathLike, name: str | os.PathLike) -> pd.DataFrame | None:
    """The table, or None when the file is missing or empty.

    Raises :class:`RunDirFileError` naming the file and line for a row whose number of fields
    differs from the header's (a torn or hand-edited row: pandas would pad it with NaN and use it),
    and for a last row without its newline (torn mid-number: ``0.8`` of ``0.8125`` parses).

    >>> import tempfile, pathlib
    >>> d = pathlib.Path(tempfile.mkdtemp()); _ = (d / "h.csv").write_text("a,b\\n1,2\\n3")
    >>> read_csv(d, "h.csv")
    Traceback (most recent call last):
    ...
    robusttrain.rundir.paths.RunDirFileError: run-directory file '...h.csv' line 3 has 1 field(s), expected 2 (a torn or edited row)
    """
    text = read_text(run_dir, name)
    if text is None or not text.strip():
        return None
    path = f"{os.path.realpath(run_dir)}{os.sep}{name}"
    try:
        rows = csv.reader(io.StringIO(text))
        header = next(rows)
        for row in rows:
            if row and len(row) != len(header):
                raise RunDirFileError(
                    f"run-directory file '{path}' line {rows.line_num} has {len(row)} "
                    f"field(s), expected {len(header)} (a torn or edited row)"
                )
        if not text.endswith("\n"):
            # every writer ends each row with a newline: a last row without one was cut short, maybe
            # mid-number ("0.8" of "0.8125"), which would parse as a plausible value
            raise RunDirFileError(
                f"run-directory file '{path}' line {text.count(chr(10)) + 1} is torn: the file ends "
                "without a newline (a write cut short); remove that line, or end it with a newline "
                "if it is complete"
            )
        frame = pd.read_csv(io.StringIO(text))
    except (csv.Error, pd.errors.ParserError, pd.errors.EmptyDataError) as err:
        raise RunDirFileError(
            f"run-directory file '{path}' is not a readable CSV table: {str(err).strip().splitlines()[0]}"
        ) from None
    return frame if len(frame) else None
