# ctxfs — one entry point.
#   make run    install what is missing, build, mount at $(MNT) (data in the default data dir)
#   make stop   unmount cleanly
#   make test   every test: unit, model, real-mount (needs /dev/fuse and root for other-uid tests)
#   make torture crash torture at a large size (a small one runs in make test)
#   make bench  benchmarks (figures go to docs/BENCHMARKS.md by hand, with the command)

MNT    ?= /tmp/ctxfs
CARGO  ?= cargo
BIN    := target/release/ctxfs

.PHONY: deps build run stop test lint unit mount-test torture bench clean

deps:
	@command -v fusermount3 >/dev/null && command -v vim >/dev/null && command -v setpriv >/dev/null || { \
	  echo "installing fuse3, vim, util-linux"; \
	  SUDO=$$( [ "$$(id -u)" = 0 ] || echo sudo ); \
	  $$SUDO apt-get update -qq && DEBIAN_FRONTEND=noninteractive $$SUDO apt-get install -y -qq fuse3 vim util-linux; }
	@test -e /dev/fuse || { echo "error: /dev/fuse is missing; FUSE is not available here" >&2; exit 1; }

build:
	$(CARGO) build --release

run: deps build
	mkdir -p $(MNT)
	$(BIN) mount $(MNT)
	@echo "try: ls $(MNT)/accounts; cat $(MNT)/.ctxfs/status; make stop"

stop:
	$(BIN) umount $(MNT)

lint:
	$(CARGO) fmt --all -- --check
	$(CARGO) clippy --all-targets -- -D warnings

unit:
	$(CARGO) test --lib --test model

mount-test: deps
	$(CARGO) test --test mount

test: deps lint
	$(CARGO) test
	$(CARGO) build
	CTXFS_BIN=target/debug/ctxfs python3 scripts/crash-torture.py --rounds 3 --writers 3

# SIGKILL the daemon during concurrent commits, N times (CI runs 3 rounds in `make test`).
torture: deps build
	python3 scripts/crash-torture.py --rounds 20 --writers 6

bench: deps build
	scripts/bench.sh

clean:
	$(CARGO) clean
