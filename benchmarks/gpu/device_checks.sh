#!/bin/sh
# Every GPU check of the project in ONE device call that fits the present 15-minute lease
# (start + this command <= 590 s + idle): the CUDA tests, a GPU fit through the product's CLI, the
# GPU protocol of Evidence v3 reduced to the headline pair, and the GPU benchmarks. Data and wheels
# travel as carried folders (built here first: `python benchmarks/gpu/pack.py` and the wheels of
# setup.sh in .whl/):
#
#   run(command="sh benchmarks/gpu/device_checks.sh", carry=[".gpudata", ".whl"], timeout_s=590)
#
# Each stage has its own time box and log, so one failing or slow stage costs only itself; every log
# lands in $OUT (env.txt, tests.log, cli.log, evidence.log, bench.log, results.md, summary.json).
#
# Evidence (reduced from evidence_gpu.sh, which needs about an hour): PraNet-style training on
# Kvasir-SEG + CVC-ClinicDB at 256 px (BasicUNet 32-32-64-128-256-32, fp32), random augmentation vs
# metamorphic training (the recipes' setting vs the method); held out: Kvasir test ids, the held-out
# ClinicDB sequences and whatever OOD folders the carried copy holds. Sized from what the H200 showed on
# 2026-11-26 (docs/results.md "GPU"): six runs of 20 epochs at once reached epoch 12 / 6 in 380 s and
# finished none, so the default is now one seed of the pair at 8 epochs (SEEDS, EPOCHS to change it;
# that this fits is an estimate from those rates, not yet run).
# The benchmarks run last, alone on the GPU (their ratios are side by side in one run).
# Dry run here on CPU before spending device time (tests skip, the GPU benchmark fails on no CUDA):
#   OUT=/tmp/dry SKIP_SETUP=1 PY=.venv/bin/python ACCEL=cpu EPOCHS=4 SIZE=32 FEATURES=4,4,8,8,16,4 \
#   EFR_CASES=8 CLI_EXTRA="+trainer.limit_train_batches=2 +trainer.limit_val_batches=2" sh benchmarks/gpu/device_checks.sh
T0=$(date +%s)
OUT="${OUT:-/tmp/out}"
mkdir -p "$OUT"
PY="${PY:-python3}"
ACCEL="${ACCEL:-gpu}"
EPOCHS="${EPOCHS:-8}"
SEEDS="${SEEDS:-0}"
SIZE="${SIZE:-256}"
FEATURES="${FEATURES:-32,32,64,128,256,32}"
EVIDENCE_S="${EVIDENCE_S:-380}"
EFR_CASES="${EFR_CASES:-100}"
RUNS="${RUNS:-runs/evidence_gpu_short}"
STAGES="${STAGES:-tests cli evidence bench}"   # also: profile (where a GPU training step's time goes)
has() { case " $STAGES " in *" $1 "*) return 0 ;; esac; return 1; }
if [ -z "$SKIP_SETUP" ]; then . benchmarks/gpu/setup.sh || exit 1; fi
export PYTHONPATH="${PYTHONPATH:-$PWD}" PYTHONUNBUFFERED=1 WANDB_MODE=offline
el() { echo "[device_checks] t=$(( $(date +%s) - T0 ))s $*"; }

{
    el "environment"
    nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader 2>&1
    nproc
    "$PY" -c "import torch, lightning, kornia, monai, albumentations, pyod, numpy; \
print('torch', torch.__version__, 'cuda', torch.version.cuda, 'available', torch.cuda.is_available(), \
torch.cuda.get_device_name() if torch.cuda.is_available() else '-'); \
print('lightning', lightning.__version__, 'kornia', kornia.__version__, 'monai', monai.__version__, \
'albumentations', albumentations.__version__, 'pyod', pyod.__version__, 'numpy', numpy.__version__)" 2>&1
} > "$OUT/env.txt"
cat "$OUT/env.txt"

# 1. the evidence runs, in the background for EVIDENCE_S seconds (SIGINT: Lightning stops cleanly)
mkdir -p "$RUNS"
EV="--dataset pranet256 --data-root .gpudata --epochs $EPOCHS --size $SIZE --features $FEATURES \
--batch-size 16 --test-fraction 0.2 --val-fraction 0.1"
EVPID=
if has evidence; then
el "evidence: start" > "$OUT/evidence.log"
timeout -s INT -k 20 "$EVIDENCE_S" "$PY" benchmarks/evidence.py $EV --accelerator "$ACCEL" \
    --precision 32-true --jobs 6 --threads 2 --conditions mt_random,metamorphic --seeds "$SEEDS" \
    --lr 3e-3 --mr-every 2 --mr-val-cases 48 --efr-cases "$EFR_CASES" --efr-policies least_loss,last \
    --resume --out "$RUNS" >> "$OUT/evidence.log" 2>&1 &
EVPID=$!
fi

# 2. the CUDA tests (every op's conformance on the cuda device, batch == per-image, replay)
if has tests; then
el "tests: start" > "$OUT/tests.log"
timeout 170 "$PY" -m pytest -q -p no:cacheprovider -m cuda \
    tests/perturbations/test_conformance.py tests/test_perturbations_augment.py tests/test_perturbations.py \
    >> "$OUT/tests.log" 2>&1
el "tests: rc=$?" >> "$OUT/tests.log"
tail -n 3 "$OUT/tests.log"
fi

# 3. a user's GPU fit through the CLI: the polyp recipe on the real Kvasir copy, the method switched on,
#    bf16 mixed precision, then the product's own check of the last checkpoint
if has cli; then
el "cli: start" > "$OUT/cli.log"
timeout 150 "$PY" -m robusttrain fit recipe=polyp data.root=.gpudata/polyp_256/kvasir_seg \
    trainer.max_epochs=1 trainer.precision=bf16-mixed trainer.enable_progress_bar=false \
    callbacks.metamorphic_training.k=4 callbacks.metamorphic_training.epsilon=0.3 \
    callbacks.metamorphic_training.consistency=1.0 run_dir=/tmp/cli_gpu $CLI_EXTRA >> "$OUT/cli.log" 2>&1
el "cli fit: rc=$?" >> "$OUT/cli.log"
timeout 60 "$PY" -m robusttrain check recipe=polyp data.root=.gpudata/polyp_256/kvasir_seg \
    ckpt=/tmp/cli_gpu/checkpoints/last.ckpt run_dir=/tmp/cli_gpu_check $CLI_EXTRA >> "$OUT/cli.log" 2>&1
el "cli check: rc=$?" >> "$OUT/cli.log"
tail -n 2 "$OUT/cli.log"
fi

# 3b. one training step's time, by Lightning hook (SimpleProfiler), each condition alone on the GPU
if has profile; then
el "profile: start" > "$OUT/profile.log"
timeout 150 "$PY" benchmarks/evidence.py $EV --accelerator "$ACCEL" --precision 32-true --threads 4 \
    --conditions plain,mt_random,metamorphic --seeds 0 --lr 3e-3 --profile-steps "${PROFILE_STEPS:-40}" \
    --out "$RUNS" >> "$OUT/profile.log" 2>&1
el "profile: rc=$?" >> "$OUT/profile.log"
grep -A 22 "\[evidence\] profile" "$OUT/profile.log" | grep -v "^---" | sed "s/[[:space:]]\+/ /g" | cut -c 1-150
fi

if [ -n "$EVPID" ]; then
wait "$EVPID"
el "evidence: rc=$?" >> "$OUT/evidence.log"
grep -h "\[evidence\] epoch" "$OUT/evidence.log" | tail -n 3
fi

# 4. the benchmarks, alone on the GPU
if has bench; then
el "bench: perturbations" > "$OUT/bench.log"
timeout 60 "$PY" benchmarks/perturbations.py --quick >> "$OUT/bench.log" 2>&1
el "bench: perturbations rc=$?" >> "$OUT/bench.log"
timeout 50 "$PY" benchmarks/training_step.py --device cuda --steps 10 --rounds 2 >> "$OUT/bench.log" 2>&1
el "bench: training_step rc=$?" >> "$OUT/bench.log"
fi

# 5. the tables of whatever runs finished
has evidence && "$PY" benchmarks/evidence.py $EV --report-only --out "$RUNS" > /dev/null 2>> "$OUT/evidence.log"
has evidence && cp "$RUNS"/pranet256/results.md "$RUNS"/pranet256/summary.json "$OUT/" 2>/dev/null
ls "$RUNS"/pranet256 >> "$OUT/evidence.log" 2>&1
el "done"
