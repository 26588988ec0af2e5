"""Evidence v2 (issue 12): failure mining and the checkpoint policies under a held-out protocol.

Protocol (one command per dataset):
- **Split** (fixed by ``--data-seed``, never by the training seed): the training set is split by
  case into train / validation / test. Polyps: Kvasir-SEG; the test part plus CVC-ClinicDB,
  CVC-ColonDB, ETIS and the PolypGen centres (C1–C6) are *held out*. ACDC: split by patient
  (both phases of a patient on one side); only the in-domain test patients are held out.
- **Conditions** (same optimiser steps; ``benchmarks/evidence/conditions.py``): ``plain``, ``random``
  (standard random augmentation with the same perturbation families), ``mined`` (failure replay
  with the recipe's family settings).
- **Choices on validation only**: after every epoch the recorder scores the validation cases
  (clean per-case Dice) and keeps the weights in memory. Checkpoints are
  picked from the *validation* history: least validation loss (``least_loss``, the checkpoint the
  conditions are compared at), best validation Dice, the last epoch, and every balanced policy
  (``last_inlier``, ``maximin``, ``pareto``, ``cvar``). Each pick is then *reported* on the held-out
  cases, which no choice ever saw (evaluated after training from the kept weights; with
  ``--heldout-curve`` every epoch is, for the held-out trade-off curve).
- **EFR** on the held-out sets at the least-loss checkpoint, with one fixed MR suite (seeded by the
  data seed, so every condition and seed meets the same follow-ups).
- **Statistics**: mean ± std over training seeds; paired differences (per held-out case, same
  seed, across conditions or policies) with a case-bootstrap 95 % CI (``paired_stats.py``).

Writes ``<out>/<dataset>/results.json`` (per-run, per-case numbers and the summary) and
``results.md`` (the tables), plus trade-off plots (validation and held-out) for every run.

Evidence v4 (issue 34, ``docs/evidence_v4/PROTOCOL.md``): ``--protocol v4`` (its conditions from
``conditions.V4_*``, the test suite ``--test-perturbations`` with the held-out families, runs under
``<out>/<dataset>_v4/``, every follow-up's Dice in ``followups.csv.gz``, fp16 ``least_loss`` / ``last``
weights, tables by ``report_v4.py``); run it through ``grid_v4.sh``.
``--dataset synthetic`` is a procedural stand-in shaped like ``polyp256`` for dry runs and tests.

    python -m benchmarks.evidence.run --dataset polyp --seeds 0,1,2 --epochs 30 --size 128 --jobs 2
    python -m benchmarks.evidence.run --dataset acdc --seeds 0,1,2 --epochs 30 --size 128 --jobs 2

The runner is split by stage (``python -m benchmarks.evidence.run`` runs :mod:`.cli`):
:mod:`.data` (the data sets and the seeded split), :mod:`.recorder` (the per-epoch validation
recorder), :mod:`.protocol` (what each protocol version fixes), :mod:`.state` (one run's
:class:`RunState`), :mod:`.train`, :mod:`.pick`, :mod:`.score` (held-out, MR, curve), :mod:`.write`
(``result.json`` and artifacts), :mod:`.pipeline` (one run's steps in order), :mod:`.summary` (the
tables of many runs), :mod:`.checks` (argument checks) and :mod:`.cli` (the arguments, ``main``).
"""

from __future__ import annotations

from benchmarks.evidence.run.cli import main
from benchmarks.evidence.run.data import DATA, SPLIT_FRACTIONS, build_data, clinicdb_sequences
from benchmarks.evidence.run.protocol import FOLLOWUP_COLUMNS, v4_family_sets

__all__ = [
    "DATA",
    "FOLLOWUP_COLUMNS",
    "SPLIT_FRACTIONS",
    "build_data",
    "clinicdb_sequences",
    "main",
    "v4_family_sets",
]
