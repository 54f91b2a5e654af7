#!/usr/bin/env bash
# make test: every test, as timed steps. The time of each step is printed at
# the end, also when a step fails, so CI's budget can be followed step by step.
#
#   build      the binaries (multi-process tests and images run them)
#   images     crescent:test, the container image of those debug binaries
#   build tests  every test binary, and the store's again with `rdma`
#   unit       unit tests of every crate (kind lib and bin)
#   integration  in-process and multi-process clusters, etcd, deploy files
#   containers   docker-compose cluster
#   chaos checks processes-mode runs with each --unsafe-... switch
#   chaos ci     the CI chaos schedule, twice, in containers
#   rdma       the store's tests with the rdma feature
#   python     the wheel, built with maturin, under pytest
set -uo pipefail
cd "$(dirname "$0")/.."

# CARGO may carry arguments (`cargo +nightly`).
read -ra CARGO <<<"${CARGO:-cargo}"
TEST_IMAGE=${TEST_IMAGE:-crescent:test}
mkdir -p target
SKIP_LOG=$PWD/target/test-skips.txt
rm -f "$SKIP_LOG"
export CRESCENT_SKIP_LOG=$SKIP_LOG CRESCENT_IMAGE=$TEST_IMAGE CRESCENT_CHAOS_IMAGE=$TEST_IMAGE

LABELS=()
SECONDS_TAKEN=()
START=$(date +%s)
FAILED=()

report() {
  echo "make test: time per step" >&2
  local i
  for i in "${!LABELS[@]}"; do
    printf '  %-13s %5d s\n' "${LABELS[$i]}" "${SECONDS_TAKEN[$i]}" >&2
  done
  printf '  %-13s %5d s\n' total $(($(date +%s) - START)) >&2
}

# timed <label> <command...>: runs it and records its time; returns its
# exit code.
timed() {
  local label=$1
  shift
  local t0 rc
  t0=$(date +%s)
  echo "make test: -- $label" >&2
  "$@"
  rc=$?
  LABELS+=("$label")
  SECONDS_TAKEN+=($(($(date +%s) - t0)))
  return "$rc"
}

# build <label> <command...>: what the tests need; nothing runs without it.
build() {
  if ! timed "$@"; then
    report
    echo "make test: FAILED in step '$1'" >&2
    exit 1
  fi
}

# check <label> <command...>: a test step; a failure is reported at the end,
# after the other test steps ran.
check() {
  timed "$@" || FAILED+=("$1")
}

# The nextest steps split the workspace by these filters; `integration` is
# whatever the others leave, so no test falls between them.
UNIT='kind(lib) | kind(bin)'
CONTAINERS='binary_id(crescent-integration::it) & test(/^compose::/)'
CHAOS='package(crescent-chaos) & kind(test)'
CHAOS_CI="$CHAOS & test(ci_schedule)"
CHAOS_CHECKS="$CHAOS & not test(ci_schedule)"
INTEGRATION="not (($UNIT) | ($CONTAINERS) | ($CHAOS))"

nextest() { "${CARGO[@]}" nextest run --no-fail-fast "$@"; }
build_tests() {
  "${CARGO[@]}" nextest run --workspace --no-run &&
    "${CARGO[@]}" nextest run -p crescent-store --features rdma --no-run
}
cargo_test() {
  "${CARGO[@]}" test --workspace --no-fail-fast &&
    "${CARGO[@]}" test -p crescent-store --features rdma --no-fail-fast
}

build build "${CARGO[@]}" build --bins
build images env PROFILE=debug IMAGE="$TEST_IMAGE" ./scripts/build-images.sh
if "${CARGO[@]}" nextest --version >/dev/null 2>&1; then
  build "build tests" build_tests
  check unit nextest --workspace -E "$UNIT"
  check integration nextest --workspace -E "$INTEGRATION"
  check containers nextest --workspace -E "$CONTAINERS"
  check "chaos checks" nextest --workspace -E "$CHAOS_CHECKS"
  check "chaos ci" nextest --workspace -E "$CHAOS_CI"
  check rdma nextest -p crescent-store --features rdma
elif ./scripts/require-all; then
  echo "make test: cargo-nextest is not installed (cargo install cargo-nextest --locked); CI needs it" >&2
  exit 1
else
  echo "SKIPPED nextest: not installed; cargo test ignores .config/nextest.toml (threads, slow timeouts)" | tee -a "$SKIP_LOG" >&2
  check "cargo test" cargo_test
fi
check python ./scripts/python-test.sh

report
if [ "${#FAILED[@]}" -gt 0 ]; then
  echo "make test: FAILED in: ${FAILED[*]}" >&2
  exit 1
fi
if [ -s "$SKIP_LOG" ]; then
  echo "make test: passed, with $(wc -l <"$SKIP_LOG") skipped:"
  sed 's/^/  /' "$SKIP_LOG"
else
  echo "make test: passed, 0 skipped"
fi
