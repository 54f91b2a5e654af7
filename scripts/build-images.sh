#!/usr/bin/env bash
# make images: builds the image crescent:<version> (and :latest) locally,
# without any registry: a root filesystem of our binaries, the shared
# libraries they link, Debian's etcd, a /bin/sh (dash) and sleep, loaded with
# `docker import`. One image serves etcd, masters, stores, crescentctl and
# the chaos workers.
#
#   PROFILE=release|debug   which cargo build to package (default release)
#   IMAGE=name:tag          its name (default crescent:latest); a release
#                           build is also tagged crescent:<version>
set -euo pipefail
cd "$(dirname "$0")/.."

PROFILE=${PROFILE:-release}
IMAGE=${IMAGE:-crescent:latest}
VERSION=$(sed -n 's/^version = "\(.*\)"/\1/p' Cargo.toml | head -1)

if ! docker version >/dev/null 2>&1; then
  # Under CI every test must run: no engine is a failure, not a skip.
  if scripts/require-all; then
    echo "images: no Docker engine answers (docker version failed); CI needs one for the container tests" >&2
    exit 1
  fi
  echo "images: SKIPPED -- no Docker engine answers (docker version failed)" >&2
  if [ -n "${CRESCENT_SKIP_LOG:-}" ]; then
    echo "SKIPPED images: no Docker engine answers (container tests will skip too)" >>"$CRESCENT_SKIP_LOG"
  fi
  exit 0
fi
ETCD=$(command -v etcd || true)
if [ -z "$ETCD" ]; then
  echo "images: etcd not installed (scripts/install-deps.sh installs etcd-server)" >&2
  exit 1
fi

BINS=(crescent-master crescent-store crescentctl crescent-bench crescent-chaos)
for b in "${BINS[@]}"; do
  if [ ! -x "target/$PROFILE/$b" ]; then
    echo "images: target/$PROFILE/$b missing (cargo build $([ "$PROFILE" = release ] && echo --release) --bins)" >&2
    exit 1
  fi
done

ROOT=$(mktemp -d /tmp/crescent-rootfs.XXXXXX)
trap 'rm -rf "$ROOT"' EXIT
mkdir -p "$ROOT"/{usr/local/bin,bin,etc,tmp,root,var/lib/crescent,var/lib/etcd}
chmod 1777 "$ROOT/tmp"
for b in "${BINS[@]}"; do
  install -s -m 755 "target/$PROFILE/$b" "$ROOT/usr/local/bin/$b"
done
install -m 755 "$ETCD" "$ROOT/usr/local/bin/etcd"
if command -v etcdctl >/dev/null 2>&1; then install -m 755 "$(command -v etcdctl)" "$ROOT/usr/local/bin/etcdctl"; fi
install -m 755 /bin/dash "$ROOT/bin/sh"
# The container harness's start wrapper waits with it (integration/src/containers.rs).
install -m 755 "$(command -v sleep)" "$ROOT/bin/sleep"

# Every shared library (and the loader) the binaries need, at the same paths.
for f in "$ROOT"/usr/local/bin/* "$ROOT/bin/sh" "$ROOT/bin/sleep"; do
  ldd "$f" 2>/dev/null | awk '$2 == "=>" && $3 ~ /^\// {print $3} $1 ~ /^\// {print $1}'
done | sort -u | while read -r lib; do
  cp -L --parents "$lib" "$ROOT"
done

echo 'root:x:0:0:root:/root:/bin/sh' >"$ROOT/etc/passwd"
echo 'root:x:0:' >"$ROOT/etc/group"
echo 'hosts: files dns' >"$ROOT/etc/nsswitch.conf"

tar -C "$ROOT" -c . | docker import \
  --change 'ENV PATH=/usr/local/bin:/bin' \
  --change 'WORKDIR /var/lib/crescent' \
  --change 'EXPOSE 50051 9003 50061 9103 2379 2380' \
  --change 'CMD ["crescent-master", "--help"]' \
  - "$IMAGE" >/dev/null
# The version tag (what the Kubernetes files name) is a release build's
# only: `make test`'s debug image (crescent:test) leaves it alone.
NAMES=$IMAGE
if [ "$PROFILE" = release ]; then
  docker tag "$IMAGE" "crescent:$VERSION"
  NAMES="crescent:$VERSION and $IMAGE"
fi
echo "images: built $NAMES from target/$PROFILE ($(docker image inspect -f '{{.Size}}' "$IMAGE" | awk '{printf "%.0f MB", $1/1e6}'))"
