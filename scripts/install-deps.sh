#!/usr/bin/env bash
# Installs what a fresh Debian machine lacks to build and test Crescent.
# Idempotent: does nothing when everything is present.
set -euo pipefail
cd "$(dirname "$0")/.."

need=()
command -v protoc >/dev/null 2>&1 || need+=(protobuf-compiler)
command -v etcd >/dev/null 2>&1 || need+=(etcd-server)
command -v curl >/dev/null 2>&1 || need+=(curl)
# libfaketime: the clock-step tests step a master's or a store's wall clock.
dpkg -s libfaketime >/dev/null 2>&1 || need+=(libfaketime)
# The store's `rdma` feature builds rdma-core's verbs bindings.
for pkg in cmake libclang-dev pkg-config libnl-3-dev libnl-route-3-dev libibverbs-dev; do
  dpkg -s "$pkg" >/dev/null 2>&1 || need+=("$pkg")
done

if ((${#need[@]})); then
  echo "install-deps: installing ${need[*]}"
  SUDO=""
  if [ "$(id -u)" != 0 ]; then SUDO="sudo"; fi
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq "${need[@]}" >/dev/null
fi

# The Python package is built with maturin and tested with pytest (numpy for
# its tensor calls: torch is optional and not installed here), and the
# Kubernetes manifests are checked with kubernetes-validate (the API's own
# schemas), all from PyPI, in a venv under target/ (never the system's
# site-packages).
VENV=target/pyenv
if ! python3 -c "import venv, ensurepip" >/dev/null 2>&1; then
  echo "install-deps: installing python3-venv"
  SUDO=""
  if [ "$(id -u)" != 0 ]; then SUDO="sudo"; fi
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq python3-venv >/dev/null
fi
if [ ! -x "$VENV/bin/maturin" ] || [ ! -x "$VENV/bin/pytest" ] || [ ! -x "$VENV/bin/wheel" ] ||
  [ ! -x "$VENV/bin/kubernetes-validate" ] || ! "$VENV/bin/python" -c "import numpy" 2>/dev/null; then
  echo "install-deps: creating $VENV with maturin, pytest, numpy, setuptools and kubernetes-validate"
  python3 -m venv "$VENV"
  "$VENV/bin/pip" install --quiet --upgrade "maturin>=1.7,<2" "pytest>=7" numpy "setuptools>=61" wheel \
    "kubernetes-validate==1.37.0"
fi

if ! command -v cargo >/dev/null 2>&1; then
  echo "install-deps: cargo not found; install Rust (rustup) first" >&2
  exit 1
fi
# `make test` runs the suite with cargo-nextest (per-test processes, the
# thread and timeout settings of .config/nextest.toml); built from crates.io.
if ! cargo nextest --version >/dev/null 2>&1; then
  echo "install-deps: installing cargo-nextest from crates.io (a few minutes on two cores)"
  cargo install --locked cargo-nextest
fi
echo "install-deps: ok (protoc $(protoc --version | cut -d' ' -f2), $(cargo --version), $(cargo nextest --version | head -1), $("$VENV/bin/maturin" --version))"
