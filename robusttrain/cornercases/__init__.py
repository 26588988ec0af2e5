"""robusttrain.cornercases — corner cases, outlier epochs and the balanced epoch (paper 004).

Pure analysis on the long history table ``case_id, epoch, <metric>_<class>…``; no Lightning.

>>> import pandas as pd
>>> from robusttrain.cornercases import find_corner_cases
>>> rows = [{"case_id": f"p{i}", "epoch": 0, "dice_lv": 0.9, "dice_rv": 0.8 + 0.01 * i} for i in range(9)]
>>> rows.append({"case_id": "bad", "epoch": 0, "dice_lv": 0.2, "dice_rv": 0.1})
>>> find_corner_cases(pd.DataFrame(rows)).case_ids
['bad']
"""

from .balanced import POLICIES, Selection, epoch_table, select_balanced_epoch, worst_fraction_mean
from .detect import MIN_SAMPLES, CornerCaseResult, OutlierEpochResult, find_corner_cases, find_outlier_epochs
from .ecod import ecod_fit, max_flagged
from .history import load_history, metric_columns
from .report import corners_report

__all__ = [
    "MIN_SAMPLES",
    "POLICIES",
    "CornerCaseResult",
    "OutlierEpochResult",
    "Selection",
    "find_corner_cases",
    "find_outlier_epochs",
    "select_balanced_epoch",
    "epoch_table",
    "worst_fraction_mean",
    "ecod_fit",
    "max_flagged",
    "load_history",
    "metric_columns",
    "corners_report",
]
