#!/bin/sh
# Evidence v4 (docs/evidence_v4/PROTOCOL.md) on a fresh machine in one command: the frozen worktree
# (cfc4183 + 4b201cd, default <repo>/../ev4code) re-made, the archived runs restored, the grid resumed.
#
#   sh benchmarks/evidence/grid_v4_fresh.sh [OUT]      # OUT default <repo>/../evidence_v4_runs
#
# The steps and the environment (PYTHON, DATA_ROOT, FROZEN, JOBS, DRY=1): grid_fresh.sh, with v4.
exec sh "$(dirname "$0")/grid_fresh.sh" v4 "$@"
