"""``np.random.default_rng(seed)``'s stream without building a Generator: :class:`Reseeder`.

The Albumentations adapter draws one 32-bit seed per call and samples the family's params from
``default_rng(seed)``, so a pipeline seed gives the same images in every version. Building that Generator
(a SeedSequence, a PCG64, a lock, a Generator) is most of the adapter's cost on small images; a
:class:`Reseeder` keeps one PCG64 Generator and sets its state to the one ``default_rng(seed)`` starts in:
numpy's SeedSequence hash of the seed (pool of 4 words, then 4 64-bit words of state) and PCG64's
seeding step, in Python integers. NumPy guarantees these streams stay the same across versions; the
constructor checks a few seeds against ``PCG64(seed)`` anyway and falls back to ``default_rng`` if one
ever differs.

Example:
    >>> import numpy as np
    >>> r = Reseeder()
    >>> bool(np.array_equal(r(12345).random(3), np.random.default_rng(12345).random(3)))
    True
"""

from __future__ import annotations

import numpy as np

_M32, _M128 = 0xFFFFFFFF, (1 << 128) - 1
_PCG_MULT = 0x2360ED051FC65DA44385DF649FCCF645  # PCG64's 128-bit LCG multiplier


def _hash_consts(init: int, mult: int, n: int) -> list[tuple[int, int]]:
    """(xor constant, multiplier) of SeedSequence's first n hashmix calls: the hash constant walks a fixed
    sequence, whatever the data."""
    out = []
    for _ in range(n):
        nxt = (init * mult) & _M32
        out.append((init, nxt))
        init = nxt
    return out


_MIX_HASH = _hash_consts(0x43B0D7E5, 0x931E8875, 16)  # mix_entropy: 4 pool words + 12 mixes
_GEN_HASH = _hash_consts(0x8B51F9DD, 0x58F38DED, 8)  # generate_state: 8 32-bit words
_MIX_ORDER = [(s, d) for s in range(4) for d in range(4) if s != d]


def _hashmix(v: int, a: int, m: int) -> int:
    v = ((v ^ a) * m) & _M32
    return v ^ (v >> 16)


_POOL_TAIL = [_hashmix(0, *_MIX_HASH[i]) for i in (1, 2, 3)]  # a 32-bit seed pads the pool with zeros


def pcg64_state(seed: int) -> tuple[int, int]:
    """(state, inc) of ``np.random.PCG64(seed)`` for a seed in [0, 2**32).

    >>> st = np.random.PCG64(7).state["state"]
    >>> pcg64_state(7) == (st["state"], st["inc"])
    True
    """
    pool = [_hashmix(seed, *_MIX_HASH[0]), *_POOL_TAIL]
    for (s, d), (a, m) in zip(_MIX_ORDER, _MIX_HASH[4:]):
        r = (0xCA01F9DD * pool[d] - 0x4973F715 * _hashmix(pool[s], a, m)) & _M32
        pool[d] = r ^ (r >> 16)
    w = [_hashmix(pool[i & 3], a, m) for i, (a, m) in enumerate(_GEN_HASH)]
    inc = (((w[4] | w[5] << 32) << 64 | (w[6] | w[7] << 32)) << 1 | 1) & _M128
    state = (inc + ((w[0] | w[1] << 32) << 64 | (w[2] | w[3] << 32))) & _M128
    return (state * _PCG_MULT + inc) & _M128, inc


def _matches_numpy() -> bool:
    return all(
        pcg64_state(s) == tuple(np.random.PCG64(s).state["state"].values())
        for s in (0, 1, 2**31 + 12345, 2**32 - 1)
    )


EXACT = _matches_numpy()  # False only if NumPy ever changed its seeding: then Reseeder uses default_rng


class Reseeder:
    """``r(seed)`` -> a Generator whose stream is ``np.random.default_rng(seed)``'s (one reused Generator:
    valid until the next call; not for sharing across threads)."""

    def __init__(self) -> None:
        self._bits = np.random.PCG64(0)
        self._gen = np.random.Generator(self._bits)
        self._state = self._bits.state

    def __call__(self, seed: int) -> np.random.Generator:
        if not EXACT or not 0 <= seed < 2**32:
            return np.random.default_rng(seed)
        st = self._state["state"]
        st["state"], st["inc"] = pcg64_state(seed)
        self._state["has_uint32"] = self._state["uinteger"] = 0
        self._bits.state = self._state
        return self._gen
