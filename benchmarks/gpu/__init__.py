"""The GPU device machine's tooling (``python -m benchmarks.gpu.pack``, ``sh benchmarks/gpu/device_checks.sh``)."""
