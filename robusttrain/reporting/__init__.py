"""robusttrain.reporting: plots, the HTML report and W&B chart helpers. Reads the run directory's
files (docs/design.md); never recomputes analysis and never imports Lightning.

>>> from robusttrain.reporting import write_plots, write_report  # doctest: +SKIP
>>> write_report("runs/acdc")                                     # doctest: +SKIP
PosixPath('runs/acdc/report.html')
"""

from robusttrain.reporting.html import render_report, write_report
from robusttrain.reporting.plots import write_plots

__all__ = ["render_report", "write_plots", "write_report"]
