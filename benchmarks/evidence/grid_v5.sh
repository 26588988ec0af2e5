#!/bin/sh
# Evidence v5 grid (issue 45, docs/evidence_v5/PROTOCOL.md): grid.sh with --protocol v5 (see there):
# four conditions x eight paired seeds, breadth-first, resumable; run it from a frozen worktree.
#   sh benchmarks/evidence/grid_v5.sh [--resume] [--jobs N] [--seeds 0,...,7] [--conditions a,b] \
#       [--tiny] [--dry-run] OUT
exec sh "$(dirname "$0")/grid.sh" --protocol v5 "$@"
