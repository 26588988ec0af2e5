"""The evidence protocols: does a training condition or checkpoint policy help, on held-out data.

Run from the repository root: ``python -m benchmarks.evidence.run ...`` (the grid:
``sh benchmarks/evidence/grid_v4.sh``; map: ``benchmarks/README.md``).
"""
