#!/bin/sh
# Evidence v5 (docs/evidence_v5/PROTOCOL.md) on a fresh machine in one command: a session here may start
# with the repository only, so the run folder and the frozen worktree of the last one can be gone.
#
#   sh benchmarks/evidence/grid_v5_fresh.sh [OUT]      # OUT default <repo>/../evidence_v5_runs
#
# 1. the frozen code: a detached worktree (FROZEN, default <repo>/../ev5code) of FROZEN_COMMIT, the commit the
#    grid started from (PROTOCOL.md names it); an existing worktree at another commit or with edits is refused;
# 2. the finished runs restored from docs/evidence_v5/runs into OUT/polyp256_v5 (read back, not retrained;
#    a run folder already there with other numbers is refused);
# 3. the grid resumed from the frozen worktree in the background (--resume --jobs 2): finished runs are
#    skipped, an interrupted one continues from its fit/last.ckpt if this machine has it, else starts over
#    (same seed, same run). Progress: OUT/grid.log; stop: kill -INT -- -$(cat OUT/grid.pid).
# Environment: PYTHON (default .venv/bin/python of this checkout), DATA_ROOT (default ../shared/data),
# FROZEN, JOBS (default 2), DRY=1 (check and restore, print the job order, start nothing).
set -eu
REPO=$(cd "$(dirname "$0")/../.." && pwd)
OUT=${1:-$(cd "$REPO/.." && pwd)/evidence_v5_runs}
FROZEN=${FROZEN:-$(cd "$REPO/.." && pwd)/ev5code}
PY=${PYTHON:-$REPO/.venv/bin/python}
DATA=${DATA_ROOT:-$(cd "$REPO/.." && pwd)/shared/data}
FROZEN_COMMIT=$(sed -n 's/^- \*\*Frozen commit\*\*: `\([0-9a-f]*\)`.*/\1/p' "$REPO/docs/evidence_v5/PROTOCOL.md" | head -n 1)
[ -n "$FROZEN_COMMIT" ] || { echo "grid_v5_fresh: docs/evidence_v5/PROTOCOL.md names no frozen commit" >&2; exit 2; }
[ -x "$PY" ] || { echo "grid_v5_fresh: no python at $PY; run 'make install' or set PYTHON" >&2; exit 2; }
[ -d "$FROZEN" ] || git -C "$REPO" worktree add -q --detach "$FROZEN" "$FROZEN_COMMIT"
[ "$(git -C "$FROZEN" rev-parse HEAD)" = "$(git -C "$REPO" rev-parse "$FROZEN_COMMIT")" ] \
  || { echo "grid_v5_fresh: $FROZEN is not $FROZEN_COMMIT; remove it (git worktree remove) and run again" >&2; exit 2; }
[ -z "$(git -C "$FROZEN" status --porcelain --untracked-files=no)" ] \
  || { echo "grid_v5_fresh: $FROZEN has local edits; the grid must run frozen code" >&2; exit 2; }
mkdir -p "$OUT/polyp256_v5"
if [ -d "$REPO/docs/evidence_v5/runs" ]; then
  PYTHONPATH="$REPO" "$PY" -m benchmarks.evidence.archive restore "$REPO/docs/evidence_v5/runs" "$OUT/polyp256_v5"
fi
cd "$FROZEN"
if [ -n "${DRY:-}" ]; then  # DRY=1: check and restore only, print the grid's job order
  PYTHON="$PY" DATA_ROOT="$DATA" sh benchmarks/evidence/grid_v5.sh --resume --dry-run "$OUT"
  exit 0
fi
PYTHON="$PY" DATA_ROOT="$DATA" setsid nohup sh benchmarks/evidence/grid_v5.sh --resume --jobs "${JOBS:-2}" "$OUT" \
  >> "$OUT.out" 2>&1 &
echo "grid_v5_fresh: the grid runs from $FROZEN ($(git -C "$FROZEN" rev-parse --short HEAD)); progress in $OUT/grid.log"
