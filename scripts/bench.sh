#!/usr/bin/env bash
# make bench: every benchmark at full size. Pass arguments through, e.g.
#   scripts/bench.sh --only tree --nodes 2000
set -euo pipefail
cd "$(dirname "$0")/.."
exec python3 scripts/bench.py "$@"
