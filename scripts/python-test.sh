#!/usr/bin/env bash
# The Python package's tests: builds the `crescent` wheel with maturin into
# the venv under target/ (made by install-deps.sh), installs it and the
# mooncake drop-in shim, and runs pytest against real master and store
# processes started from target/debug.
set -euo pipefail
cd "$(dirname "$0")/.."

VENV=target/pyenv
if [ ! -x "$VENV/bin/maturin" ] || [ ! -x "$VENV/bin/pytest" ]; then
  echo "python-test: $VENV lacks maturin or pytest; run scripts/install-deps.sh" >&2
  exit 1
fi
rm -f target/wheels/crescent-*.whl
# workspace-features: the test wheel shares the compiled crates of make
# test's workspace build (see client/python/Cargo.toml).
"$VENV/bin/maturin" build --quiet -m client/python/Cargo.toml --features workspace-features -i "$VENV/bin/python" -o target/wheels
"$VENV/bin/pip" install --quiet --force-reinstall --no-deps target/wheels/crescent-*.whl
"$VENV/bin/pip" install --quiet --force-reinstall --no-deps --no-build-isolation ./client/python/mooncake-shim
CRESCENT_BIN_DIR="$PWD/target/debug" "$VENV/bin/python" -m pytest -q client/python/tests "$@"
