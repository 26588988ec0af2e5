"""Paired comparisons with a case bootstrap (shared by the evidence benchmarks).

Values are (seeds x cases) matrices over the *same* held-out cases, one row per training seed,
so condition A's row s is paired with condition B's row s (same seed, same split, same
follow-ups). The bootstrap resamples *cases* (columns, the same draw for A and B), recomputes the
statistic on the resampled matrices, and reports the 2.5 / 97.5 percentiles: the uncertainty from
which cases happened to be held out. Seeds are not resampled (three are too few to resample);
their spread is reported separately as the std over seeds, and (Evidence v4) by
:func:`seed_interval`: a t-interval over the per-seed paired differences, the uncertainty from
which training seeds happened to be run (a stalled seed moves every case of that seed at once).

>>> import numpy as np
>>> a = np.array([[0.2, 0.4, 0.6]]); b = np.array([[0.1, 0.2, 0.3]])
>>> r = paired_bootstrap(a, b, mean_difference, n_boot=200)
>>> round(r["estimate"], 3), r["lo"] <= r["estimate"] <= r["hi"]
(0.2, True)
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

Stat = Callable[[np.ndarray, np.ndarray], float]


def mean_difference(a: np.ndarray, b: np.ndarray) -> float:
    """Mean of A − B over seeds and cases."""
    return float(np.mean(a - b))


def relative_change(a: np.ndarray, b: np.ndarray) -> float:
    """sum(A) / sum(B) − 1 (e.g. −0.25 = A has 25 % fewer errors than B); NaN when sum(B) = 0."""
    sb = float(np.sum(b))
    return float(np.sum(a) / sb - 1.0) if sb > 0 else float("nan")


def worst_fraction_difference(k: float) -> Stat:
    """Mean over seeds of (mean of A's worst ``ceil(k·n)`` cases − the same for B)."""
    from robusttrain.cornercases import worst_fraction_mean

    def stat(a: np.ndarray, b: np.ndarray) -> float:
        return float(np.mean([worst_fraction_mean(x, k) - worst_fraction_mean(y, k) for x, y in zip(a, b)]))

    return stat


def paired_bootstrap(
    a, b, stat: Stat, n_boot: int = 2000, seed: int = 0, alpha: float = 0.05, clusters=None
) -> dict:
    """``{"estimate", "lo", "hi", "n_cases", "n_seeds", "n_clusters"}``: ``stat(A, B)`` and its bootstrap CI.

    ``clusters`` (one label per case column, e.g. the CVC-ClinicDB video sequence): the bootstrap
    draws whole clusters with replacement, every case of a drawn cluster comes along (frames of one
    sequence are not independent). None: every case is its own cluster.

    >>> a = np.array([[1.0, 1.0, 0.0, 0.0]]); b = np.zeros((1, 4))
    >>> r = paired_bootstrap(a, b, mean_difference, n_boot=300, clusters=["s1", "s1", "s2", "s2"])
    >>> r["n_clusters"], sorted({round(x, 2) for x in (r["lo"], r["hi"])})
    (2, [0.0, 1.0])
    """
    a, b = np.atleast_2d(np.asarray(a, dtype=np.float64)), np.atleast_2d(np.asarray(b, dtype=np.float64))
    if a.shape != b.shape or a.size == 0:
        raise ValueError(f"paired matrices must have the same non-empty shape, got {a.shape} and {b.shape}")
    if not (np.isfinite(a).all() and np.isfinite(b).all()):
        raise ValueError("paired values must be finite (a NaN Dice or EFR would be reported as a number)")
    rng = np.random.default_rng(seed)
    n = a.shape[1]
    if clusters is None:
        draws = (idx for idx in rng.integers(0, n, size=(n_boot, n)))
        n_clusters = n
    else:
        if len(clusters) != n:
            raise ValueError(f"clusters has {len(clusters)} labels for {n} cases")
        labels = list(dict.fromkeys(clusters))
        members = [np.flatnonzero(np.asarray(clusters, dtype=object) == g) for g in labels]
        n_clusters = len(labels)
        draws = (
            np.concatenate([members[j] for j in pick])
            for pick in rng.integers(0, n_clusters, size=(n_boot, n_clusters))
        )
    boots = np.array([stat(a[:, idx], b[:, idx]) for idx in draws])
    boots = boots[np.isfinite(boots)]
    lo, hi = (
        np.percentile(boots, [100 * alpha / 2, 100 * (1 - alpha / 2)])
        if boots.size
        else (float("nan"), float("nan"))
    )
    return {
        "estimate": stat(a, b),
        "lo": float(lo),
        "hi": float(hi),
        "n_cases": int(n),
        "n_seeds": int(a.shape[0]),
        "n_clusters": int(n_clusters),
    }


def seed_interval(a, b, stat: Stat, alpha: float = 0.05) -> dict:
    """``{"estimate", "lo", "hi", "n_seeds", "per_seed"}``: ``stat`` per seed (row ``s`` of A against row
    ``s`` of B), and a Student-t interval over those per-seed differences (n - 1 degrees of freedom;
    NaN bounds with one seed). Seeds, not cases, are the unit: the interval is wide when the seeds
    disagree, however many cases each has.

    >>> a = np.array([[0.6, 0.8], [0.5, 0.7], [0.7, 0.9]]); b = a - np.array([[0.02], [0.04], [0.03]])
    >>> r = seed_interval(a, b, mean_difference)
    >>> round(r["estimate"], 3), [round(x, 3) for x in r["per_seed"]], round(r["lo"], 4), round(r["hi"], 4)
    (0.03, [0.02, 0.04, 0.03], 0.0052, 0.0548)
    """
    from scipy import stats

    a, b = np.atleast_2d(np.asarray(a, dtype=np.float64)), np.atleast_2d(np.asarray(b, dtype=np.float64))
    if a.shape != b.shape or a.size == 0:
        raise ValueError(f"paired matrices must have the same non-empty shape, got {a.shape} and {b.shape}")
    d = np.array([stat(a[s : s + 1], b[s : s + 1]) for s in range(a.shape[0])])
    n, est = len(d), float(np.mean(d))
    if n < 2 or not np.isfinite(d).all():
        lo = hi = float("nan")
    else:
        half = float(stats.t.ppf(1 - alpha / 2, n - 1) * np.std(d, ddof=1) / np.sqrt(n))
        lo, hi = est - half, est + half
    return {"estimate": est, "lo": lo, "hi": hi, "n_seeds": int(n), "per_seed": [float(x) for x in d]}
