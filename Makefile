# Crescent: `make demo` starts a local cluster; `make test` runs every test.
CARGO ?= cargo

.PHONY: all deps build release images test lint fmt demo chaos bench-meta bench-data bench-python clean

all: build

deps:
	@./scripts/install-deps.sh

build: deps
	$(CARGO) build --bins

release: deps
	$(CARGO) build --release --bins

# The container image crescent:latest (and crescent:<version>), built locally
# from the release binaries with `docker import`; no registry is used.
images: release
	./scripts/build-images.sh

# Every test: unit, storage conformance, in-process and multi-process
# clusters, the deploy files, docker-compose, the short chaos schedule, and
# the Python package (wheel built with maturin, pytest against real processes).
# Multi-process tests run the binaries, so they are built first; the
# container tests use an image of those same (debug) binaries, tagged
# crescent:test so a release image from `make images` is left alone.
# The time of each step is printed at the end (scripts/test-all.sh).
TEST_IMAGE ?= crescent:test
test: deps
	CARGO='$(CARGO)' TEST_IMAGE='$(TEST_IMAGE)' ./scripts/test-all.sh

lint: deps
	$(CARGO) fmt --all -- --check
	$(CARGO) clippy --workspace --all-targets --features crescent-store/rdma -- -D warnings

fmt:
	$(CARGO) fmt --all

demo: release
	./scripts/demo.sh

# A long chaos soak: make chaos DURATION=30m SEED=42 (MODE=auto|containers|processes).
DURATION ?= 30m
SEED ?=
MODE ?= auto
chaos: images
	./target/release/crescent-chaos run --schedule soak --duration $(DURATION) --mode $(MODE) \
		$(if $(SEED),--seed $(SEED),) --out target/chaos-soak

bench-meta: release
	./target/release/crescentctl bench meta

bench-data: release
	./target/release/crescentctl bench data

# Python client vs Rust client on one local cluster, release builds of both.
bench-python: release
	target/pyenv/bin/maturin build --quiet --release -m client/python/Cargo.toml -i target/pyenv/bin/python -o target/wheels-release
	target/pyenv/bin/pip install --quiet --force-reinstall --no-deps target/wheels-release/crescent-*.whl
	target/pyenv/bin/python client/python/harness/bench.py --bin-dir target/release

clean:
	$(CARGO) clean
