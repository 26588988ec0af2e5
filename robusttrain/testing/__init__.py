"""Test helpers that ship with the package, for robusttrain's tests, its benchmarks and a user's own tests.

:mod:`robusttrain.testing.emulated_device`: run the accelerator code path on the CPU and count what it
launches (``with EmulatedDevice() as dev:``). It lives in the package, not under ``tests/`` or
``benchmarks/``, so that both of those import it the same way and neither imports the other.
"""
