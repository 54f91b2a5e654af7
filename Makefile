# Crescent: `make demo` starts a local cluster; `make test` runs every test.
CARGO ?= cargo

.PHONY: all deps build release test lint fmt demo bench-meta bench-data clean

all: build

deps:
	@./scripts/install-deps.sh

build: deps
	$(CARGO) build --bins

release: deps
	$(CARGO) build --release --bins

# Every test: unit, storage conformance, in-process and multi-process clusters.
# Multi-process tests run the binaries, so they are built first.
test: deps
	$(CARGO) build --bins
	@if $(CARGO) nextest --version >/dev/null 2>&1; then \
		$(CARGO) nextest run --workspace --no-fail-fast && \
		$(CARGO) nextest run -p crescent-store --features rdma --no-fail-fast; \
	else \
		echo "cargo-nextest not installed; using cargo test"; \
		$(CARGO) test --workspace --no-fail-fast && \
		$(CARGO) test -p crescent-store --features rdma --no-fail-fast; \
	fi

lint: deps
	$(CARGO) fmt --all -- --check
	$(CARGO) clippy --workspace --all-targets -- -D warnings
	$(CARGO) clippy -p crescent-store --features rdma --all-targets -- -D warnings

fmt:
	$(CARGO) fmt --all

demo: release
	./scripts/demo.sh

bench-meta: release
	./target/release/crescentctl bench meta

bench-data: release
	./target/release/crescentctl bench data

clean:
	$(CARGO) clean
