#!/bin/sh
# Robust training v2 (issue 30): does the consistency objective train on the seed where every paired run
# of Evidence v3 stalled? One run -- v3's data, model, settings and draws (condition
# metamorphic_consistency: worst of 4, epsilon 0.3, lambda 1, half-size scoring) with the new objective,
# training seed 2 -- compared with v3's per-epoch validation loss (acceptance: below 0.55 at epoch 29,
# where all six paired seed-2 runs ended at >= 0.77; healthy in-place runs of seed 2 ended 0.46-0.50).
#
#   sh benchmarks/evidence/stall_reproducer.sh [OUT] [COMMIT]     # OUT default <repo>/../repro_runs; COMMIT default HEAD
#
# Resumable: the run continues from OUT/polyp256/metamorphic_consistency_s2/fit/last.ckpt (same frozen
# code: OUT/code, a detached worktree of COMMIT made on the first call). Progress per epoch:
#   python -m benchmarks.evidence.progress OUT/polyp256/metamorphic_consistency_s2
set -eu
REPO=$(cd "$(dirname "$0")/../.." && pwd)
OUT=${1:-$(cd "$REPO/.." && pwd)/repro_runs}
PY=${PYTHON:-$REPO/.venv/bin/python}
DATA_ROOT=${DATA_ROOT:-$(cd "$REPO/.." && pwd)/shared/data}
if [ ! -d "$DATA_ROOT/polyp_256" ]; then
  echo "stall_reproducer: no polyp_256 under DATA_ROOT=$DATA_ROOT (set DATA_ROOT to the shared data folder)" >&2
  exit 2
fi
mkdir -p "$OUT"
[ -d "$OUT/code" ] || git -C "$REPO" worktree add -q --detach "$OUT/code" "${2:-HEAD}"
cd "$OUT/code"
# the frozen code's entry point: a module since the benchmarks/evidence/ package, a script before
if [ -e benchmarks/evidence/run.py ] || [ -d benchmarks/evidence/run ]; then RUN="-m benchmarks.evidence.run"; else RUN=benchmarks/evidence.py; fi
PYTHONPATH="$OUT/code" OMP_NUM_THREADS=1 nohup "$PY" $RUN --dataset polyp256 \
  --conditions metamorphic_consistency --seeds 2 --size 128 --epochs 30 --features 16,16,32,64,128,16 \
  --batch-size 8 --lr 3e-3 --mr-every 2 --mr-val-cases 50 --efr-cases 150 --efr-policies least_loss,last \
  --threads 1 --jobs 1 --resume --data-root "$DATA_ROOT" --out "$OUT" >> "$OUT/log.txt" 2>&1 &
echo "stall_reproducer: started (log $OUT/log.txt)"
