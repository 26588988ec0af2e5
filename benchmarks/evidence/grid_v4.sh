#!/bin/sh
# Evidence v4 grid (issue 34, docs/evidence_v4/PROTOCOL.md): grid.sh with --protocol v4 (see there).
#   sh benchmarks/evidence/grid_v4.sh [--resume] [--jobs N] [--seeds 0,1,2,3,4] [--conditions a,b] \
#       [--lr-tail F] [--tiny] [--dry-run] OUT
exec sh "$(dirname "$0")/grid.sh" --protocol v4 "$@"
