#!/bin/sh
# The evidence grids (Evidence v4, issue 34, docs/evidence_v4/PROTOCOL.md; Evidence v5, issue 45,
# docs/evidence_v5/PROTOCOL.md): breadth-first, N parallel queues, resumable. grid_v4.sh / grid_v5.sh
# call this with their --protocol.
#
#   sh benchmarks/evidence/grid.sh --protocol v4|v5 [--resume] [--jobs N] [--seeds S] [--conditions a,b] \
#       [--lr-tail F] [--tiny] [--dry-run] OUT
#
# Run it from a frozen checkout (a worktree nobody edits while the grid runs): every run must train
# with the same code. Jobs are (condition, seed) in breadth-first order -- seed 0 of every condition,
# then seed 1, ... -- so a partial table is balanced. N queues (default 2, one per core) each take the
# next unclaimed job (a claim is `mkdir OUT/claims/<job>`, atomic), run it with one torch thread at
# nice 10 (`benchmarks.evidence.run --protocol P --resume`), then re-write the tables of the whole grid
# (OUT/polyp256_P/results.md, "partial: N of M runs" until all finished).
# Logs: OUT/grid.log (one line per job start / end / failure), OUT/queue_<i>.log (the runs' output).
# Every argument and data folder is checked once before any queue starts (benchmarks.evidence.run --check-only).
#
# Resume: after a kill (or a failed job), the same command with --resume: finished runs (result.json)
# are skipped, an interrupted run continues from its fit/last.ckpt. Without --resume an OUT that holds
# runs is refused. Stop a running grid: kill -INT -- -$(cat OUT/grid.pid)   (the whole process group;
# Lightning stops at the end of the step, the run resumes later).
# v4: --lr-tail F: the constant-LR tail (default 0.25, the recipes' of issue 30; the balanced average
# averages its inlier epochs); refused in one line where the library has no lr_tail (0 = v3's cosine).
# v5: each condition's model and schedule are fixed (conditions.V5_MODELS); --lr-tail is refused.
# --tiny: synthetic data, 32 px, 2 epochs, a small net, 3 test families -- the infrastructure on a
# handful of steps (the tests run it). --dry-run: print the job order and the run command, nothing else.
# Environment: PYTHON (default: .venv/bin/python of this checkout, else python3), DATA_ROOT (default:
# the shared data beside the checkout), NICE (default 10).
set -eu
PROTO=v4
[ "${1:-}" = --protocol ] && { PROTO=${2:-}; shift 2 || true; }
case "$PROTO" in
  v4) SEEDS=0,1,2,3,4 CONDS=plain,random,hard_consistency,augmix_consistency,random_shift,mined_dose ;;
  v5) SEEDS=0,1,2,3,4,5,6,7 CONDS=scratch_random,pretrained_random,pretrained_plain,pretrained_steer ;;
  *) echo "evidence_grid: --protocol '$PROTO': expected v4 or v5 (first argument)" >&2; exit 2 ;;
esac
NAME=evidence_grid_$PROTO
usage="usage: sh benchmarks/evidence/grid_$PROTO.sh [--resume] [--jobs N] [--seeds S] [--conditions C] [--lr-tail F] [--tiny] [--dry-run] OUT"
REPO=$(cd "$(dirname "$0")/../.." && pwd)
RESUME=0 JOBS=2 TINY=0 DRY=0 OUT="" LR_TAIL=""
while [ $# -gt 0 ]; do
  case "$1" in
    --resume) RESUME=1 ;;
    --tiny) TINY=1 ;;
    --dry-run) DRY=1 ;;
    --jobs) JOBS=${2:-}; shift ;;
    --seeds) SEEDS=${2:-}; shift ;;
    --conditions) CONDS=${2:-}; shift ;;
    --lr-tail) LR_TAIL=${2:-}; shift ;;
    -*) echo "$NAME: unknown option $1; $usage" >&2; exit 2 ;;
    *) [ -z "$OUT" ] || { echo "$NAME: two OUT folders ($OUT, $1); $usage" >&2; exit 2; }; OUT=$1 ;;
  esac
  shift
done
[ -n "$OUT" ] || { echo "$NAME: no OUT folder; $usage" >&2; exit 2; }
case "$JOBS" in ''|*[!0-9]*|0) echo "$NAME: --jobs '$JOBS': expected an integer >= 1" >&2; exit 2 ;; esac
if [ -n "${PYTHON:-}" ]; then PY=$PYTHON
elif [ -x "$REPO/.venv/bin/python" ]; then PY=$REPO/.venv/bin/python
else PY=python3; fi
DATA_ROOT=${DATA_ROOT:-$(cd "$REPO/.." && pwd)/shared/data}
if [ "$PROTO" = v5 ] && [ -n "$LR_TAIL" ]; then
  echo "$NAME: --lr-tail does not apply to v5 (each condition's schedule is fixed in conditions.V5_MODELS)" >&2; exit 2
fi
if [ "$TINY" = 1 ] && [ "$PROTO" = v4 ]; then
  DATASET=synthetic
  set -- --dataset synthetic --size 32 --epochs 2 --min-epoch 0 --features 4,4,8,8,16,4 --batch-size 4 \
    --perturbations blur,contrast --test-perturbations blur,motion_blur --severities 2 --efr-cases 4 \
    --efr-policies least_loss,last --n-boot 50 --lr-tail "${LR_TAIL:-0}"
elif [ "$TINY" = 1 ]; then
  DATASET=synthetic
  set -- --dataset synthetic --size 32 --epochs 2 --min-epoch 0 --batch-size 4 \
    --perturbations blur,contrast --test-perturbations blur,motion_blur --severities 2 --efr-cases 4 \
    --efr-policies least_loss,ema --n-boot 50 --curve-every 1 --curve-cases 4
elif [ "$PROTO" = v4 ]; then
  DATASET=polyp256
  set -- --dataset polyp256 --size 128 --epochs 30 --features 16,16,32,64,128,16 --batch-size 8 --lr 3e-3 \
    --mr-every 0 --efr-cases 150 --efr-policies least_loss,last --lr-tail "${LR_TAIL:-0.25}"
else  # v5 (docs/evidence_v5/PROTOCOL.md): the model and its schedule come with the condition
  DATASET=polyp256
  set -- --dataset polyp256 --size 128 --epochs 30 --batch-size 8 \
    --mr-every 0 --efr-cases 150 --efr-policies least_loss,ema --curve-every 5 --curve-cases 32
fi
set -- --protocol "$PROTO" "$@" --threads 1 --jobs 1 --data-root "$DATA_ROOT" --out "$OUT"
RUNS="$OUT/${DATASET}_$PROTO"
# breadth-first: every condition of seed 0, then of seed 1, ...
JOBLIST=$(for s in $(echo "$SEEDS" | tr ',' ' '); do for c in $(echo "$CONDS" | tr ',' ' '); do echo "$c:$s"; done; done)
if [ "$DRY" = 1 ]; then
  echo "$JOBLIST"
  echo "run: OMP_NUM_THREADS=1 nice -n ${NICE:-10} $PY -m benchmarks.evidence.run $* --resume --conditions C --seeds S"
  exit 0
fi
"$PY" -c "import torch, lightning" 2>/dev/null || {
  echo "$NAME: $PY cannot import torch and lightning; set PYTHON=<venv>/bin/python" >&2; exit 2; }
# every argument, data folder and condition checked before anything is created (one line, exit 2)
PYTHONPATH="$REPO" OMP_NUM_THREADS=1 "$PY" -m benchmarks.evidence.run "$@" --conditions "$CONDS" \
  --seeds "$SEEDS" --check-only > /dev/null
if [ -d "$RUNS" ] && [ -n "$(ls -A "$RUNS" 2>/dev/null)" ] && [ "$RESUME" = 0 ]; then
  echo "$NAME: $RUNS holds runs; continue them with --resume (or choose another OUT)" >&2
  exit 2
fi
mkdir -p "$OUT"
if [ -f "$OUT/grid.pid" ] && kill -0 "$(cat "$OUT/grid.pid")" 2>/dev/null; then
  echo "$NAME: a grid is running on $OUT (pid $(cat "$OUT/grid.pid")); stop it first" >&2
  exit 2
fi
echo $$ > "$OUT/grid.pid"
rm -rf "$OUT/claims"  # claims of an earlier (stopped) grid: --resume re-runs what did not finish
mkdir -p "$OUT/claims"
log() { echo "$(date -u +%FT%TZ) $*" >> "$OUT/grid.log"; }
log "grid start: jobs=$JOBS conditions=$CONDS seeds=$SEEDS tiny=$TINY code=$(git -C "$REPO" rev-parse --short HEAD 2>/dev/null || echo '?')"
worker() {
  i=$1 failed=0
  shift
  for job in $JOBLIST; do
    mkdir "$OUT/claims/$job" 2>/dev/null || continue  # another queue has it
    c=${job%%:*} s=${job##*:}
    if [ -f "$RUNS/${c}_s$s/result.json" ]; then log "skip $job (finished)"; continue; fi
    log "start $job (queue $i)"
    if (cd "$REPO" && PYTHONPATH="$REPO" OMP_NUM_THREADS=1 nice -n "${NICE:-10}" "$PY" -m benchmarks.evidence.run \
        "$@" --resume --conditions "$c" --seeds "$s") >> "$OUT/queue_$i.log" 2>&1; then
      log "done $job"
      # the tables of the whole grid so far (atomic writes: two queues may do this at once)
      (cd "$REPO" && PYTHONPATH="$REPO" OMP_NUM_THREADS=1 "$PY" -m benchmarks.evidence.run "$@" --conditions "$CONDS" \
        --seeds "$SEEDS" --report-only) > /dev/null 2>> "$OUT/queue_$i.log" || log "report failed after $job"
    else
      log "failed $job (exit $?; see queue_$i.log)"; failed=1
    fi
  done
  return $failed
}
pids=""
i=1
while [ "$i" -le "$JOBS" ]; do
  worker "$i" "$@" &
  pids="$pids $!"
  i=$((i + 1))
done
status=0
for p in $pids; do wait "$p" || status=1; done
log "grid end: status=$status"
rm -f "$OUT/grid.pid"
[ "$status" = 0 ] || echo "$NAME: some runs failed (see $OUT/grid.log); rerun with --resume" >&2
exit $status
