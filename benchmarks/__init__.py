"""robusttrain's benchmarks: speed (``benchmarks.perf``) and evidence (``benchmarks.evidence``).

Run them as modules from the repository root (``python -m benchmarks.perf.training_step``); see
``benchmarks/README.md`` for the map and the methodology contract. Not shipped with the library.
"""
