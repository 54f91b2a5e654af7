#!/usr/bin/env bash
# make test: every test, as timed steps. The time of each step is printed at
# the end, also when a step fails, so CI's budget can be followed step by step.
#
#   build      the binaries (multi-process tests and images run them)
#   images     crescent:test, the container image of those debug binaries
#   build tests  every test binary
#   unit       unit tests of every crate (kind lib and bin), rdma's included
#   integration  in-process and multi-process clusters, etcd, deploy files
#   containers   docker-compose cluster
#   chaos checks processes-mode runs with each --unsafe-... switch
#   chaos ci     the CI chaos schedule and a short one, in containers
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

# One build serves every step: the store's `rdma` feature is on for the
# whole workspace (it only adds the verbs module), so the binaries, the
# test binaries and the rdma tests share one compilation.
FEATURES=(--features crescent-store/rdma)
TIMES=target/test-times
rm -rf "$TIMES"
mkdir -p "$TIMES"

# nextest <label> <args...>: a nextest run; its per-test times (JUnit) are
# kept under $TIMES for the slowest-tests list at the end.
nextest() {
  local label=$1
  shift
  local rc=0
  "${CARGO[@]}" nextest run --no-fail-fast "${FEATURES[@]}" "$@" || rc=$?
  if [ -f target/nextest/default/junit.xml ]; then
    mv target/nextest/default/junit.xml "$TIMES/${label// /-}.xml"
  fi
  return "$rc"
}
cargo_test() { "${CARGO[@]}" test --workspace --no-fail-fast "${FEATURES[@]}"; }

# The slowest tests of this run, from the JUnit files nextest wrote.
slowest() {
  python3 - "$TIMES" <<'PY' >&2 || true
import glob, sys, xml.etree.ElementTree as ET
cases = []
for f in glob.glob(sys.argv[1] + "/*.xml"):
    for c in ET.parse(f).getroot().iter("testcase"):
        cases.append((float(c.get("time", 0)), c.get("name", "?")))
if cases:
    print("make test: slowest tests")
    for t, name in sorted(cases, reverse=True)[:12]:
        print(f"  {t:7.1f} s  {name}")
PY
}

build build "${CARGO[@]}" build --bins "${FEATURES[@]}"
build images env PROFILE=debug IMAGE="$TEST_IMAGE" ./scripts/build-images.sh
if "${CARGO[@]}" nextest --version >/dev/null 2>&1; then
  build "build tests" "${CARGO[@]}" nextest run --workspace --no-run "${FEATURES[@]}"
  check unit nextest unit --workspace -E "$UNIT"
  check integration nextest integration --workspace -E "$INTEGRATION"
  check containers nextest containers --workspace -E "$CONTAINERS"
  check "chaos checks" nextest "chaos checks" --workspace -E "$CHAOS_CHECKS"
  check "chaos ci" nextest "chaos ci" --workspace -E "$CHAOS_CI"
elif ./scripts/require-all; then
  echo "make test: cargo-nextest is not installed (cargo install cargo-nextest --locked); CI needs it" >&2
  exit 1
else
  echo "SKIPPED nextest: not installed; cargo test ignores .config/nextest.toml (threads, slow timeouts)" | tee -a "$SKIP_LOG" >&2
  check "cargo test" cargo_test
fi
check python ./scripts/python-test.sh

report
slowest
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
