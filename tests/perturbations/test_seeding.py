"""The adapter's Reseeder gives exactly default_rng(seed)'s stream (the same images as ever per seed)."""

from __future__ import annotations

import numpy as np

from robusttrain.perturbations.seeding import EXACT, Reseeder, pcg64_state


def test_reseeder_matches_default_rng_on_every_draw_kind():
    assert EXACT  # this NumPy seeds PCG64 as the Reseeder computes it
    r = Reseeder()
    seeds = [0, 1, 2**32 - 1, *np.random.default_rng(0).integers(0, 2**32, 300).tolist()]
    for seed in seeds:
        st = np.random.PCG64(seed).state["state"]
        assert pcg64_state(seed) == (st["state"], st["inc"])
        for draw in (
            lambda g: g.random(3),
            lambda g: g.uniform(0.5, 2, (2,)).astype(np.float32),
            lambda g: g.integers(0, 7, (4,)),
            lambda g: g.standard_normal(5),
            lambda g: g.integers(0, 2**32, 3, dtype=np.uint32),
        ):  # uint32 leaves a half word buffered
            a, b = draw(r(seed)), draw(np.random.default_rng(seed))
            assert np.array_equal(a, b)
    # a buffered half word from the previous seed never leaks into the next stream
    g = r(5)
    g.integers(0, 2**32, 1, dtype=np.uint32)
    assert np.array_equal(
        r(6).integers(0, 2**32, 3, dtype=np.uint32),
        np.random.default_rng(6).integers(0, 2**32, 3, dtype=np.uint32),
    )


def test_out_of_range_seeds_fall_back_to_default_rng():
    r = Reseeder()
    for seed in (2**32, 2**40 + 3):
        assert np.array_equal(r(seed).random(2), np.random.default_rng(seed).random(2))
