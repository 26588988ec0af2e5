#!/bin/sh
# Every GPU check of the project in ONE device call that fits the present 15-minute lease
# (start + this command <= 540 s + idle). Default stages (issue 31, what a GPU user's step costs):
#   steps    one training step's time, plain vs random augmentation (k=1, q=.5) vs the recipes'
#            MetamorphicTraining (callbacks/metamorphic_training.yaml), for the BasicUNet (fp32)
#            and recipe=polyp_gpu's FlexibleUNet-b0 (bf16-mixed), 256 px batch 16 (benchmarks/perf/training_step.py)
#   mrcheck  the MR check at budget=0.25 against the training it follows (FlexibleUNet-b0, bf16-mixed)
#   kornia   perturbation throughput vs Kornia on the GPU at 512^2 batch 64, colour families as % of the
#            card's copy bandwidth (benchmarks/perf/perturbations.py --cuda-only)
#   tests    the CUDA tests (conformance, augment, the GPU users' models)
# Targets (issue 31): random augmentation <= 1.15x a plain step, (train + check) / train <= 1.2,
# colour families >= 25 % of the copy bandwidth.
# Opt-in stages (STAGES="..."): gpurecipe (a 1-epoch CLI fit of recipe=polyp_gpu on the carried Kvasir,
# model.pretrained=false: the device has no internet), and the older evidence set: cli evidence bench profile
# (STAGES="tests cli evidence bench" is what this script ran before issue 31).
# Each stage has its own time box and log, and a stage that would end past TOTAL_S (540 s from the start)
# is skipped, so one failing or slow stage costs only itself and the call always fits; every log lands in
# $OUT (env.txt, steps.log, mrcheck.log, kornia.log, tests.log, checks.md ...). Wheels travel as .whl/
# (setup.sh), data as .gpudata/ (pack.py; only the evidence and gpurecipe stages read it):
#
#   run(command="sh benchmarks/gpu/device_checks.sh", carry=[".whl"], timeout_s=590)
#
# Dry run here on CPU before spending device time (the GPU-only parts fail fast, the rest runs tiny):
#   OUT=/tmp/dry SKIP_SETUP=1 PY=.venv/bin/python DEVICE=cpu BENCH_SIZE=32 BENCH_BATCH=2 BENCH_STEPS=3 \
#   MR_EPOCHS=2 MR_VAL=4 sh benchmarks/gpu/device_checks.sh
#
# Evidence (opt-in, reduced from evidence_gpu.sh, which needs about an hour): PraNet-style training on
# Kvasir-SEG + CVC-ClinicDB at 256 px (BasicUNet 32-32-64-128-256-32, fp32), random augmentation vs
# metamorphic training; one seed of the pair at 8 epochs (SEEDS, EPOCHS to change it). Its dry run:
#   OUT=/tmp/dry SKIP_SETUP=1 PY=.venv/bin/python ACCEL=cpu EPOCHS=4 SIZE=32 FEATURES=4,4,8,8,16,4 STAGES="cli evidence" \
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
STAGES="${STAGES:-steps mrcheck kornia tests}"   # also: gpurecipe, cli, evidence, bench, profile
DEVICE="${DEVICE:-cuda}"
BENCH_SIZE="${BENCH_SIZE:-256}"
BENCH_BATCH="${BENCH_BATCH:-16}"
BENCH_STEPS="${BENCH_STEPS:-10}"
MR_EPOCHS="${MR_EPOCHS:-3}"
MR_VAL="${MR_VAL:-64}"
TOTAL_S="${TOTAL_S:-540}"
has() { case " $STAGES " in *" $1 "*) return 0 ;; esac; return 1; }
# fits BOX: true when a stage of BOX seconds still ends before TOTAL_S; else says so in checks.md
fits() {
    if [ $(( $(date +%s) - T0 + $1 )) -le "$TOTAL_S" ]; then return 0; fi
    echo "- skipped $2: its ${1} s box would end past TOTAL_S=${TOTAL_S} s" >> "$OUT/checks.md"
    return 1
}
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

echo "# device checks (issue 31): $(sed -n '2p;4p' "$OUT/env.txt" | tr '\n' ' ')" > "$OUT/checks.md"
TS="$PY -m benchmarks.perf.training_step --device $DEVICE --size $BENCH_SIZE --batch-size $BENCH_BATCH"

# A. one training step's time: plain vs random augmentation vs the recipes' setting, both recipes' models
if has steps; then
: > "$OUT/steps.log"
for spec in "basic_unet 32-true" "flexible_unet bf16-mixed"; do
    set -- $spec
    fits "${STEPS_S:-90}" "steps $1" || continue
    el "steps: $1 $2" >> "$OUT/steps.log"
    timeout -k 10 "${STEPS_S:-90}" $TS --steps "$BENCH_STEPS" --rounds 2 --model "$1" --precision "$2" \
        --only "random aug,recipe" >> "$OUT/steps.log" 2>&1
    el "steps: $1 rc=$?" >> "$OUT/steps.log"
done
{ echo; echo "## step time (benchmarks/perf/training_step.py)"; grep -E "^(\||torch |\[device)" "$OUT/steps.log"; } >> "$OUT/checks.md"
tail -n 12 "$OUT/steps.log"
fi

# B. the MR check at budget=0.25 against the training it follows (recipe=polyp_gpu's model and precision)
if has mrcheck && fits "${MR_S:-100}" mrcheck; then
el "mrcheck: start" > "$OUT/mrcheck.log"
timeout -k 10 "${MR_S:-100}" $TS --steps $(( BENCH_STEPS * 3 )) --rounds 1 --only plain --model flexible_unet \
    --precision bf16-mixed --mr-budget 0.25 --mr-epochs "$MR_EPOCHS" --mr-val "$MR_VAL" >> "$OUT/mrcheck.log" 2>&1
el "mrcheck: rc=$?" >> "$OUT/mrcheck.log"
{ echo; echo "## MR check at budget=0.25"; grep -E "^(\||MR check|\[device)" "$OUT/mrcheck.log"; } >> "$OUT/checks.md"
tail -n 8 "$OUT/mrcheck.log"
fi

# C. perturbation throughput vs Kornia on the GPU at 512^2 batch 64
if has kornia && fits "${KORNIA_S:-70}" kornia; then
el "kornia: start" > "$OUT/kornia.log"
timeout -k 10 "${KORNIA_S:-70}" "$PY" -m benchmarks.perf.perturbations --cuda-only --quick --size "${KORNIA_SIZE:-512}" \
    --batch "${KORNIA_BATCH:-64}" >> "$OUT/kornia.log" 2>&1
el "kornia: rc=$?" >> "$OUT/kornia.log"
{ echo; echo "## perturbations vs Kornia (benchmarks/perf/perturbations.py --cuda-only)"; echo '```'; \
  grep -v "^\[device" "$OUT/kornia.log"; echo '```'; } >> "$OUT/checks.md"
tail -n 5 "$OUT/kornia.log"
fi

# D. a GPU user's fit of recipe=polyp_gpu through the CLI (opt-in: reads the carried .gpudata)
if has gpurecipe && fits "${RECIPE_S:-150}" gpurecipe; then
el "gpurecipe: start" > "$OUT/gpurecipe.log"
timeout -s INT -k 20 "${RECIPE_S:-150}" "$PY" -m robusttrain fit recipe=polyp_gpu \
    data.root=.gpudata/polyp_256/kvasir_seg model.pretrained=false trainer.max_epochs=1 \
    trainer.enable_progress_bar=false run_dir=/tmp/polyp_gpu $CLI_EXTRA >> "$OUT/gpurecipe.log" 2>&1
el "gpurecipe: rc=$?" >> "$OUT/gpurecipe.log"
tail -n 3 "$OUT/gpurecipe.log"
fi

# 1. the evidence runs, in the background for EVIDENCE_S seconds (SIGINT: Lightning stops cleanly)
mkdir -p "$RUNS"
EV="--dataset pranet256 --data-root .gpudata --epochs $EPOCHS --size $SIZE --features $FEATURES \
--batch-size 16 --test-fraction 0.2 --val-fraction 0.1"
EVPID=
if has evidence; then
el "evidence: start" > "$OUT/evidence.log"
timeout -s INT -k 20 "$EVIDENCE_S" "$PY" -m benchmarks.evidence.run $EV --accelerator "$ACCEL" \
    --precision 32-true --jobs 6 --threads 2 --conditions mt_random,metamorphic --seeds "$SEEDS" \
    --lr 3e-3 --mr-every 2 --mr-val-cases 48 --efr-cases "$EFR_CASES" --efr-policies least_loss,last \
    --resume --out "$RUNS" >> "$OUT/evidence.log" 2>&1 &
EVPID=$!
fi

# 2. the CUDA tests (every op's conformance on the cuda device, batch == per-image, replay)
if has tests; then
el "tests: start" > "$OUT/tests.log"
LEFT=$(( TOTAL_S - ($(date +%s) - T0) - 10 ))
[ "$LEFT" -gt "${TESTS_S:-170}" ] && LEFT="${TESTS_S:-170}"
[ "$LEFT" -lt 20 ] && LEFT=20
timeout "$LEFT" "$PY" -m pytest -q -p no:cacheprovider -m cuda \
    tests/perturbations/test_conformance.py tests/test_perturbations_augment.py tests/test_perturbations.py \
    tests/test_models_gpu_users.py >> "$OUT/tests.log" 2>&1
el "tests: rc=$?" >> "$OUT/tests.log"
{ echo; echo "## CUDA tests"; tail -n 2 "$OUT/tests.log"; } >> "$OUT/checks.md"
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
timeout 150 "$PY" -m benchmarks.evidence.run $EV --accelerator "$ACCEL" --precision 32-true --threads 4 \
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
timeout 60 "$PY" -m benchmarks.perf.perturbations --quick >> "$OUT/bench.log" 2>&1
el "bench: perturbations rc=$?" >> "$OUT/bench.log"
timeout 50 "$PY" -m benchmarks.perf.training_step --device cuda --steps 10 --rounds 2 >> "$OUT/bench.log" 2>&1
el "bench: training_step rc=$?" >> "$OUT/bench.log"
fi

# 5. the tables of whatever runs finished
has evidence && "$PY" -m benchmarks.evidence.run $EV --report-only --out "$RUNS" > /dev/null 2>> "$OUT/evidence.log"
has evidence && cp "$RUNS"/pranet256/results.md "$RUNS"/pranet256/summary.json "$OUT/" 2>/dev/null
ls "$RUNS"/pranet256 >> "$OUT/evidence.log" 2>&1
el "done"
