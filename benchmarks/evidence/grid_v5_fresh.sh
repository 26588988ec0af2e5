#!/bin/sh
# Evidence v5 (docs/evidence_v5/PROTOCOL.md) on a fresh machine in one command: the frozen worktree (the
# commit PROTOCOL.md names, default <repo>/../ev5code) re-made, the archived runs restored, the grid resumed.
#
#   sh benchmarks/evidence/grid_v5_fresh.sh [OUT]      # OUT default <repo>/../evidence_v5_runs
#
# The steps and the environment (PYTHON, DATA_ROOT, FROZEN, JOBS, DRY=1): grid_fresh.sh, with v5.
exec sh "$(dirname "$0")/grid_fresh.sh" v5 "$@"
