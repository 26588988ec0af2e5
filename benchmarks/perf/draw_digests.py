"""Digests of metamorphic-training draws, to show that a change to the draw path keeps every image.

Issue 31 asks that batching passes give "the same images as today for every seed". This draws three
steps of ``WorstOfK`` (the endoscopy families, severities up to 5, q=0.75) for every combination of
image size (64, 90, 128, 256 px: 90 has a cell grid that is not a whole number of 16-blocks, so the
joint feces/blood placement declines there), batch (4, 16, 33), k (1, 4) and seed (0, 1, 2), and prints
one md5 of the follow-up images per combination. Run it on two checkouts and diff the outputs:

    OMP_NUM_THREADS=1 PYTHONPATH=. python -m benchmarks.perf.draw_digests > after.txt   # in each checkout
    diff before.txt after.txt && echo identical

(The digests are of float32 bytes: compare checkouts on one machine and torch build, not across them.)

Not on :mod:`benchmarks.common` (no run header, no ``--json``), on purpose: it measures nothing (no time,
no count that a load or a device moves), and its whole output is meant to be diffed between checkouts, so
a first line naming the commit and the time would make every such diff differ.
"""

from __future__ import annotations

import argparse
import hashlib

import torch

from robusttrain.perturbations.suites import SUITES
from robusttrain.training.worst_of_k import WorstOfK


def digest(size: int, batch: int, k: int, seed: int, steps: int = 3) -> str:
    """md5 of the follow-up images of ``steps`` draws of one configuration."""
    torch.manual_seed(seed)
    x = torch.rand(batch, 3, size, size)
    m = torch.zeros(batch, size, size, dtype=torch.long)
    m[:, size // 3 : size // 2, size // 4 : size // 2] = 1
    w = WorstOfK(families=SUITES["endoscopy"], k=k, q=0.75, epsilon=1.0, seed=seed, severity_caps=5)
    score = lambda c, mm: c.mean(tuple(range(1, c.ndim)))  # noqa: E731 -- a stand-in for the model
    h = hashlib.md5()
    for step in range(steps):
        h.update(w(x, m, score, step=step).images.numpy().tobytes())
    return h.hexdigest()


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sizes", type=int, nargs="+", default=[64, 90, 128, 256])
    ap.add_argument("--batches", type=int, nargs="+", default=[4, 16, 33])
    ap.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    args = ap.parse_args(argv)
    for size in args.sizes:
        for batch in args.batches:
            for k in (1, 4):
                for seed in args.seeds:
                    print(f"{size} {batch} {k} {seed} {digest(size, batch, k, seed)}", flush=True)


if __name__ == "__main__":
    main()
