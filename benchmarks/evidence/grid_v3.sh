#!/bin/sh
# Evidence v3 grid on a fresh machine, resumable across sessions (docs/results.md, Evidence v3).
#
#   sh benchmarks/evidence/grid_v3.sh [OUT]            # OUT default <repo>/../evidence_runs
#
# 1. restores the archived finished runs (docs/evidence_v3/runs/*.json.gz) into OUT/polyp256/, so
#    they are read back, not re-trained;
# 2. freezes the code: a detached worktree of HEAD in OUT/code (every run of a grid must train with the
#    same code while you keep editing the checkout);
# 3. starts two background queues (one per core, nice 10, one thread each), in the order of what the
#    claims need first; each run is `benchmarks.evidence.run --resume` (a finished run is skipped, an interrupted
#    one continues from its fit/last.ckpt). Logs: OUT/queue_a.log, OUT/queue_b.log.
# Afterwards: `python -m benchmarks.evidence.archive save OUT/polyp256 docs/evidence_v3/runs` and the
# tables with `python -m benchmarks.evidence.run <same args> --report-only` (see docs/results.md).
set -eu
REPO=$(cd "$(dirname "$0")/../.." && pwd)
OUT=${1:-$(cd "$REPO/.." && pwd)/evidence_runs}
PY=${PYTHON:-$REPO/.venv/bin/python}
# the data beside the checkout that runs this script: benchmarks.evidence.run's own default (../shared/data of the
# code) would point beside the frozen worktree in OUT, where there is none
DATA_ROOT=${DATA_ROOT:-$(cd "$REPO/.." && pwd)/shared/data}
if [ ! -d "$DATA_ROOT/polyp_256" ]; then
  echo "evidence_grid: no polyp_256 under DATA_ROOT=$DATA_ROOT (set DATA_ROOT to the shared data folder)" >&2
  exit 2
fi
mkdir -p "$OUT/polyp256"
PYTHONPATH="$REPO" "$PY" -m benchmarks.evidence.archive restore "$REPO/docs/evidence_v3/runs" "$OUT/polyp256"
if [ ! -d "$OUT/code" ]; then
  git -C "$REPO" worktree add -q --detach "$OUT/code" HEAD
fi
cat > "$OUT/run_one.sh" <<EOF
#!/bin/sh
cd "$OUT/code"
# the frozen code's entry point: a module since the benchmarks/evidence/ package, a script before
if [ -e benchmarks/evidence/run.py ] || [ -d benchmarks/evidence/run ]; then RUN="-m benchmarks.evidence.run"; else RUN=benchmarks/evidence.py; fi
PYTHONPATH="$OUT/code" OMP_NUM_THREADS=1 exec nice -n 10 "$PY" \$RUN --dataset polyp256 \\
  --conditions "\$1" --seeds "\$2" --size 128 --epochs 30 --features 16,16,32,64,128,16 --batch-size 8 \\
  --lr 3e-3 --mr-every 2 --mr-val-cases 50 --efr-cases 150 --efr-policies least_loss,last --threads 1 \\
  --jobs 1 --resume --data-root "$DATA_ROOT" --out "$OUT"
EOF
queue() {  # queue LOG cond:seed ...
  log=$1; shift
  for job in "$@"; do
    sh "$OUT/run_one.sh" "${job%%:*}" "${job##*:}" >> "$log" 2>&1 || echo "failed: $job" >> "$log"
  done
}
# A: the comparisons the claims rest on (random vs metamorphic, seeds), B: the ablations and mined replay;
# the 21 runs of seeds 0-2 are archived (finished 2026-11-26), so both queues skip to seeds 3-4 of random
# augmentation and consistency only: does the paired stall of seed 2 recur? (docs/results.md)
(queue "$OUT/queue_a.log" mt_random:1 metamorphic:1 mt_random:2 metamorphic:2 metamorphic_uniform:0 \
  plain:1 plain:2 metamorphic_uniform:1 metamorphic_uniform:2 mt_random:3 mt_random:4 &)
(queue "$OUT/queue_b.log" worst_of_k_only:0 consistency_only:0 mined:0 worst_of_k_only:1 consistency_only:1 \
  mined:1 worst_of_k_only:2 consistency_only:2 mined:2 consistency_only:3 consistency_only:4 &)
echo "evidence_grid: two queues started; logs in $OUT/queue_a.log and $OUT/queue_b.log"
