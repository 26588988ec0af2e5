#!/bin/sh
# Evidence v3, GPU protocol (issue 22; PraNet-style): ONE command, run from the repository root on the
# device machine with the data and wheels carried (built here first: python -m benchmarks.gpu.pack, and
# the wheels in .whl/, see setup.sh):
#
#   run(command="sh benchmarks/gpu/evidence_gpu.sh", carry=[".gpudata", ".whl"], timeout_s=600)
#
# The device tool stops a command at 10 minutes, so this script stops itself at BUDGET_S (default 540 s)
# and resumes on the next call (benchmarks.evidence.run --resume: finished runs are read back, an interrupted run
# continues from its last epoch; runs/ is ignored, so it stays on the warm machine between calls).
# Written for three calls (<= 25 min on one H100); the rates measured on an H200 on 2026-11-26
# (docs/results/evidence_v3.md "GPU": ~27 s per epoch for k=1 and ~55 s for the method, six runs sharing the GPU)
# put the whole grid nearer an hour: call it until it reports every run. Each call copies the tables so
# far to $OUT. The checks that fit a 15-minute lease: benchmarks/gpu/device_checks.sh.
#
# Protocol: train on Kvasir-SEG + CVC-ClinicDB (Kvasir split by file id, ClinicDB by video sequence;
# 20 % test / 10 % validation of each), every checkpoint chosen on the joint validation split, reported
# on held-out Kvasir, the held-out ClinicDB sequences, ColonDB, ETIS and PolypGen. 256 px: the data here
# is stored at 256 x 256 (PraNet trains at 352 from the originals; upsampling 256 -> 352 adds no
# information and costs 1.9x the pixels). Conditions and metrics as the CPU protocol.
set -e
. benchmarks/gpu/setup.sh
BUDGET_S="${BUDGET_S:-540}"
OUTDIR=runs/evidence_gpu
nvidia-smi --query-gpu=name,memory.total --format=csv,noheader || true
rc=0
timeout -s INT -k 30 "$BUDGET_S" python3 -m benchmarks.evidence.run --dataset pranet256 --data-root .gpudata \
  --accelerator gpu --precision bf16-mixed --jobs 3 --threads 4 \
  --conditions plain,mt_random,metamorphic,mined,consistency_only,worst_of_k_only --seeds 0,1,2 \
  --size 256 --epochs 30 --features 32,32,64,128,256,32 --batch-size 16 --lr 3e-3 \
  --test-fraction 0.2 --val-fraction 0.1 --mr-every 2 --mr-val-cases 64 \
  --efr-policies least_loss,last --resume --out "$OUTDIR" > "$OUTDIR.log" 2>&1 || rc=$?
mkdir -p "${OUT:-/tmp/out}"
cp "$OUTDIR.log" "${OUT:-/tmp/out}/" 2>/dev/null || true
python3 -m benchmarks.evidence.run --dataset pranet256 --data-root .gpudata --report-only --out "$OUTDIR" \
  --epochs 30 --size 256 --features 32,32,64,128,256,32 --batch-size 16 > /dev/null 2>&1 || true
cp "$OUTDIR"/pranet256/results.md "$OUTDIR"/pranet256/summary.json "${OUT:-/tmp/out}/" 2>/dev/null || true
grep -h '"condition"' "$OUTDIR.log" | tail -20 || true
if [ "$rc" = 124 ]; then echo "evidence_gpu.sh: stopped at ${BUDGET_S}s; call again to resume"; exit 0; fi
exit "$rc"
