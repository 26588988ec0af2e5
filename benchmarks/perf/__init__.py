"""Speed benchmarks: what a feature costs, as ratios measured side by side in one run.

Run from the repository root: ``python -m benchmarks.perf.<name>`` (map: ``benchmarks/README.md``).
"""
