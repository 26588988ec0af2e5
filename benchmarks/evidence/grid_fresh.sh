#!/bin/sh
# An evidence grid (docs/evidence_v4/PROTOCOL.md, docs/evidence_v5/PROTOCOL.md) on a fresh machine in one
# command: a session here may start with the repository only, so the run folder and the frozen worktree
# of the last one can be gone. The protocols' entry points call it: grid_v4_fresh.sh, grid_v5_fresh.sh.
#
#   sh benchmarks/evidence/grid_fresh.sh v4|v5 [OUT]      # OUT default <repo>/../evidence_<v>_runs
#
# 1. the frozen code: a detached worktree (FROZEN, default <repo>/../ev4code, ../ev5code) of the commit the
#    protocol's grid ran from; an existing worktree at other code or with edits is refused.
#    v4: cfc4183 with 4b201cd cherry-picked (the protocol's amendment of 2026-11-26: 43480b0 on the machine
#    that started the grid; the same parent and the same one-commit change, so the same files);
#    v5: the "Frozen commit" docs/evidence_v5/PROTOCOL.md names;
# 2. the finished runs restored from docs/evidence_<v>/runs into OUT/polyp256_<v> (read back, not retrained;
#    a run folder already there with other numbers is refused);
# 3. the grid resumed from the frozen worktree in the background (--resume --jobs 2): finished runs are
#    skipped, an interrupted one continues from its fit/last.ckpt if this machine has it, else starts over
#    (same seed, same run). Progress: OUT/grid.log; stop: kill -INT -- -$(cat OUT/grid.pid).
# Environment: PYTHON (default .venv/bin/python of this checkout), DATA_ROOT (default ../shared/data),
# FROZEN, JOBS (default 2), DRY=1 (check and restore, print the job order, start nothing).
set -eu
V=${1:-}
case "$V" in
  v4|v5) shift ;;
  *) echo "grid_fresh: the protocol first: v4 or v5, got '$V'" >&2; exit 2 ;;
esac
TOOL=grid_${V}_fresh
REPO=$(cd "$(dirname "$0")/../.." && pwd)
OUT=${1:-$(cd "$REPO/.." && pwd)/evidence_${V}_runs}
FROZEN=${FROZEN:-$(cd "$REPO/.." && pwd)/e${V}code}
PY=${PYTHON:-$REPO/.venv/bin/python}
DATA=${DATA_ROOT:-$(cd "$REPO/.." && pwd)/shared/data}
[ -x "$PY" ] || { echo "$TOOL: no python at $PY; run 'make install' or set PYTHON" >&2; exit 2; }
if [ "$V" = v4 ]; then
  BASE=cfc4183 FIX=4b201cd
  if [ ! -d "$FROZEN" ]; then
    git -C "$REPO" worktree add -q --detach "$FROZEN" "$BASE"
    git -C "$FROZEN" -c user.name=evidence -c user.email=evidence@localhost cherry-pick "$FIX" > /dev/null
  fi
  [ "$(git -C "$FROZEN" rev-parse "HEAD^")" = "$(git -C "$REPO" rev-parse "$BASE")" ] \
    || { echo "$TOOL: $FROZEN is not $BASE + $FIX; remove it (git worktree remove) and run again" >&2; exit 2; }
  pid() { git patch-id --stable | cut -d' ' -f1; }
  [ "$(git -C "$FROZEN" diff "$BASE" HEAD | pid)" = "$(git -C "$REPO" show "$FIX" | pid)" ] \
    || { echo "$TOOL: $FROZEN holds more than $FIX on $BASE; remove it and run again" >&2; exit 2; }
  GRID=benchmarks/evidence_grid_v4.sh  # its path in the frozen commit (before benchmarks/ was split)
else
  FROZEN_COMMIT=$(sed -n 's/^- \*\*Frozen commit\*\*: `\([0-9a-f]*\)`.*/\1/p' "$REPO/docs/evidence_v5/PROTOCOL.md" | head -n 1)
  [ -n "$FROZEN_COMMIT" ] || { echo "$TOOL: docs/evidence_v5/PROTOCOL.md names no frozen commit" >&2; exit 2; }
  [ -d "$FROZEN" ] || git -C "$REPO" worktree add -q --detach "$FROZEN" "$FROZEN_COMMIT"
  [ "$(git -C "$FROZEN" rev-parse HEAD)" = "$(git -C "$REPO" rev-parse "$FROZEN_COMMIT")" ] \
    || { echo "$TOOL: $FROZEN is not $FROZEN_COMMIT; remove it (git worktree remove) and run again" >&2; exit 2; }
  GRID=benchmarks/evidence/grid_v5.sh
fi
[ -z "$(git -C "$FROZEN" status --porcelain --untracked-files=no)" ] \
  || { echo "$TOOL: $FROZEN has local edits; the grid must run frozen code" >&2; exit 2; }
mkdir -p "$OUT/polyp256_$V"
if [ -d "$REPO/docs/evidence_$V/runs" ]; then
  PYTHONPATH="$REPO" "$PY" -m benchmarks.evidence.archive restore "$REPO/docs/evidence_$V/runs" "$OUT/polyp256_$V"
fi
cd "$FROZEN"
if [ -n "${DRY:-}" ]; then  # DRY=1: check and restore only, print the grid's job order
  PYTHON="$PY" DATA_ROOT="$DATA" sh "$GRID" --resume --dry-run "$OUT"
  exit 0
fi
PYTHON="$PY" DATA_ROOT="$DATA" setsid nohup sh "$GRID" --resume --jobs "${JOBS:-2}" "$OUT" >> "$OUT.out" 2>&1 &
echo "$TOOL: the grid runs from $FROZEN ($(git -C "$FROZEN" rev-parse --short HEAD)); progress in $OUT/grid.log"
