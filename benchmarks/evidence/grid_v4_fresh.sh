#!/bin/sh
# Evidence v4 (docs/evidence_v4/PROTOCOL.md) on a fresh machine in one command: each session here starts
# with the repository only, so the run folder and the frozen worktree of the last one are gone.
#
#   sh benchmarks/evidence/grid_v4_fresh.sh [OUT]      # OUT default <repo>/../evidence_v4_runs
#
# 1. the frozen code: a detached worktree (FROZEN, default <repo>/../ev4code) of cfc4183 with 4b201cd
#    cherry-picked (the protocol's amendment of 2026-11-26: 43480b0 on the machine that started the grid;
#    the same parent and the same one-commit change, so the same files);
# 2. the finished runs restored from docs/evidence_v4/runs into OUT/polyp256_v4 (read back, not retrained;
#    a run folder already there with other numbers is refused);
# 3. the grid resumed from the frozen worktree in the background (--resume --jobs 2): finished runs are
#    skipped, an interrupted one continues from its fit/last.ckpt if this machine has it, else starts over
#    (same seed, same run). Progress: OUT/grid.log; stop: kill -INT -- -$(cat OUT/grid.pid).
# Environment: PYTHON (default .venv/bin/python of this checkout), DATA_ROOT (default ../shared/data),
# FROZEN, DRY=1 (check and restore, print the job order, start nothing).
set -eu
REPO=$(cd "$(dirname "$0")/../.." && pwd)
OUT=${1:-$(cd "$REPO/.." && pwd)/evidence_v4_runs}
FROZEN=${FROZEN:-$(cd "$REPO/.." && pwd)/ev4code}
PY=${PYTHON:-$REPO/.venv/bin/python}
DATA=${DATA_ROOT:-$(cd "$REPO/.." && pwd)/shared/data}
BASE=cfc4183 FIX=4b201cd
[ -x "$PY" ] || { echo "grid_v4_fresh: no python at $PY; run 'make install' or set PYTHON" >&2; exit 2; }
if [ ! -d "$FROZEN" ]; then
  git -C "$REPO" worktree add -q --detach "$FROZEN" "$BASE"
  git -C "$FROZEN" -c user.name=evidence -c user.email=evidence@localhost cherry-pick "$FIX" > /dev/null
fi
[ "$(git -C "$FROZEN" rev-parse "HEAD^")" = "$(git -C "$REPO" rev-parse "$BASE")" ] \
  || { echo "grid_v4_fresh: $FROZEN is not $BASE + $FIX; remove it (git worktree remove) and run again" >&2; exit 2; }
pid() { git patch-id --stable | cut -d' ' -f1; }
[ "$(git -C "$FROZEN" diff "$BASE" HEAD | pid)" = "$(git -C "$REPO" show "$FIX" | pid)" ] \
  || { echo "grid_v4_fresh: $FROZEN holds more than $FIX on $BASE; remove it and run again" >&2; exit 2; }
[ -z "$(git -C "$FROZEN" status --porcelain --untracked-files=no)" ] \
  || { echo "grid_v4_fresh: $FROZEN has local edits; the grid must run frozen code" >&2; exit 2; }
mkdir -p "$OUT/polyp256_v4"
PYTHONPATH="$REPO" "$PY" -m benchmarks.evidence.archive restore "$REPO/docs/evidence_v4/runs" "$OUT/polyp256_v4"
cd "$FROZEN"
if [ -n "${DRY:-}" ]; then  # DRY=1: check and restore only, print the grid's job order
  PYTHON="$PY" DATA_ROOT="$DATA" sh benchmarks/evidence_grid_v4.sh --resume --dry-run "$OUT"
  exit 0
fi
PYTHON="$PY" DATA_ROOT="$DATA" setsid nohup sh benchmarks/evidence_grid_v4.sh --resume --jobs 2 "$OUT" \
  >> "$OUT.out" 2>&1 &
echo "grid_v4_fresh: the grid runs from $FROZEN ($(git -C "$FROZEN" rev-parse --short HEAD)); progress in $OUT/grid.log"
