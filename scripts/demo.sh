#!/usr/bin/env bash
# make demo: a local Crescent cluster on loopback -- etcd (when installed, else
# static peers), three masters and one store -- a short put/get workload, the
# cluster status, a leader kill and the new leader. Runs until Ctrl-C, then
# stops every process it started.
set -euo pipefail
cd "$(dirname "$0")/.."

BIN=./target/release
DIR=$(mktemp -d /tmp/crescent-demo.XXXXXX)
PIDS=()
cleanup() {
  echo
  echo "demo: stopping ${#PIDS[@]} processes (logs and data in $DIR)"
  for p in "${PIDS[@]}"; do kill "$p" 2>/dev/null || true; done
  for p in "${PIDS[@]}"; do wait "$p" 2>/dev/null || true; done
}
trap cleanup EXIT
trap 'exit 0' INT TERM

# Token mode, as a real cluster runs: fresh tokens for this demo; every
# program below finds its token through these variables.
"$BIN/crescentctl" tokens init "$DIR/tokens" >/dev/null
export CRESCENT_TOKEN_FILE="$DIR/tokens/client.token"
export CRESCENT_ADMIN_TOKEN_FILE="$DIR/tokens/admin.token"
export CRESCENT_CLUSTER_TOKEN_FILE="$DIR/tokens/cluster.token"
echo "demo: tokens in $DIR/tokens (client, admin, cluster)"
# Mutual TLS on every gRPC connection: a fresh CA and certificates. Masters
# and the store present the node certificate (flags below), crescentctl the
# client certificate (these variables).
"$BIN/crescentctl" certs init "$DIR/certs" >/dev/null
export CRESCENT_TLS_CERT="$DIR/certs/client.pem"
export CRESCENT_TLS_KEY="$DIR/certs/client.key"
export CRESCENT_TLS_CA="$DIR/certs/ca.pem"
NODE_TLS=(--tls-cert "$DIR/certs/node.pem" --tls-key "$DIR/certs/node.key" --tls-ca "$DIR/certs/ca.pem")
echo "demo: certificates in $DIR/certs (CA, node, client)"

BASE=${CRESCENT_DEMO_PORT:-50051}
ETCD_PORT=$((BASE + 20))
STORE_PORT=$((BASE + 10))
MASTER_LIST="127.0.0.1:$BASE,127.0.0.1:$((BASE + 1)),127.0.0.1:$((BASE + 2))"

if command -v etcd >/dev/null 2>&1; then
  # etcd over TLS too: it serves the node certificate and answers only
  # clients with a certificate of the demo CA; masters, the store and
  # crescentctl speak TLS to it (CRESCENT_ETCD_TLS).
  echo "demo: starting etcd on 127.0.0.1:$ETCD_PORT (TLS, client certificates required)"
  etcd --name demo --data-dir "$DIR/etcd" \
    --listen-client-urls "https://127.0.0.1:$ETCD_PORT" --advertise-client-urls "https://127.0.0.1:$ETCD_PORT" \
    --cert-file "$DIR/certs/node.pem" --key-file "$DIR/certs/node.key" \
    --trusted-ca-file "$DIR/certs/ca.pem" --client-cert-auth \
    --listen-peer-urls "http://127.0.0.1:$((ETCD_PORT + 1))" \
    --initial-advertise-peer-urls "http://127.0.0.1:$((ETCD_PORT + 1))" \
    --initial-cluster "demo=http://127.0.0.1:$((ETCD_PORT + 1))" >"$DIR/etcd.log" 2>&1 &
  PIDS+=($!)
  for _ in $(seq 1 100); do
    if (exec 3<>"/dev/tcp/127.0.0.1/$ETCD_PORT") 2>/dev/null; then break; fi
    sleep 0.1
  done
  MEMBERSHIP=(--etcd "127.0.0.1:$ETCD_PORT" --cluster demo)
  MASTERS="etcd://127.0.0.1:$ETCD_PORT/demo"
  export CRESCENT_ETCD_TLS=1
else
  echo "demo: etcd not installed; masters use static --peers"
  MEMBERSHIP=(--peers "1=127.0.0.1:$BASE,2=127.0.0.1:$((BASE + 1)),3=127.0.0.1:$((BASE + 2))")
  MASTERS="$MASTER_LIST"
fi

start_master() {
  local id=$1
  "$BIN/crescent-master" --node-id "$id" --listen "127.0.0.1:$((BASE + id - 1))" \
    --http "127.0.0.1:$((9002 + id))" --data-dir "$DIR/master-$id" "${MEMBERSHIP[@]}" "${NODE_TLS[@]}" \
    >>"$DIR/master-$id.log" 2>&1 &
  PIDS+=($!)
  eval "MASTER_PID_$id=$!"
}

echo "demo: starting three masters"
for id in 1 2 3; do start_master "$id"; done
for _ in $(seq 1 100); do
  VOTERS=$("$BIN/crescentctl" --master "$MASTERS" members --json 2>/dev/null | grep -c '"voter": true' || true)
  if [ "${VOTERS:-0}" -ge 3 ]; then break; fi
  sleep 0.1
done
"$BIN/crescentctl" --master "$MASTERS" leader

echo "demo: starting a store with a 256 MiB segment (TCP and /dev/shm)"
"$BIN/crescent-store" --master "$MASTERS" --listen "127.0.0.1:$STORE_PORT" --segment-size 256mb --shm \
  "${NODE_TLS[@]}" >"$DIR/store.log" 2>&1 &
PIDS+=($!)
sleep 1

echo
echo "demo: put and get real bytes"
head -c 4194304 /dev/urandom >"$DIR/value.bin"
"$BIN/crescentctl" --master "$MASTERS" put demo-object --file "$DIR/value.bin"
"$BIN/crescentctl" --master "$MASTERS" get demo-object --out "$DIR/value.out"
cmp "$DIR/value.bin" "$DIR/value.out" && echo "demo: the 4 MiB object read back identical"

echo
echo "demo: a short metadata workload (3 000 objects, batches of 128)"
CRESCENT_TOKEN_FILE="$CRESCENT_ADMIN_TOKEN_FILE" "$BIN/crescentctl" bench meta --masters "$MASTER_LIST" --objects 3000 --single-objects 200 --batch 1,128 | grep -E "^(CLUSTER|given)"

echo
"$BIN/crescentctl" --master "$MASTERS" status

LEADER=$("$BIN/crescentctl" --master "$MASTERS" leader --json | sed -E 's/.*"leader_id":([0-9]+).*/\1/')
PID_VAR="MASTER_PID_$LEADER"
echo
echo "demo: killing the leader (node $LEADER, pid ${!PID_VAR}) with SIGKILL"
{ kill -9 "${!PID_VAR}" && wait "${!PID_VAR}"; } 2>/dev/null || true
START=$(date +%s%N)
for _ in $(seq 1 200); do
  NEW=$("$BIN/crescentctl" --master "$MASTER_LIST" leader --json 2>/dev/null | sed -E 's/.*"leader_id":([0-9]+).*/\1/' || true)
  if [ -n "$NEW" ] && [ "$NEW" != "$LEADER" ]; then break; fi
  sleep 0.02
done
echo "demo: new leader after $(( ($(date +%s%N) - START) / 1000000 )) ms:"
"$BIN/crescentctl" --master "$MASTERS" leader
"$BIN/crescentctl" --master "$MASTERS" get demo-object --out "$DIR/value.after"
cmp "$DIR/value.bin" "$DIR/value.after" && echo "demo: the object is still there after the failover"
echo "demo: the workload continues on the new leader"
CRESCENT_TOKEN_FILE="$CRESCENT_ADMIN_TOKEN_FILE" "$BIN/crescentctl" bench meta --masters "$MASTER_LIST" --objects 2000 --batch 128 | grep -E "^(CLUSTER|given)"

echo
echo "demo: restarting node $LEADER; it rejoins as a follower"
start_master "$LEADER"
sleep 1.5
"$BIN/crescentctl" --master "$MASTERS" status
echo
echo "demo: without a token, the cluster refuses:"
env -u CRESCENT_TOKEN_FILE -u CRESCENT_ADMIN_TOKEN_FILE "$BIN/crescentctl" --master "$MASTERS" get demo-object --out /dev/null 2>&1 | tail -1 || true
echo "demo: without a client certificate (clear text), the cluster refuses:"
env -u CRESCENT_TLS_CERT -u CRESCENT_TLS_KEY -u CRESCENT_TLS_CA -u CRESCENT_ETCD_TLS "$BIN/crescentctl" --master "$MASTER_LIST" get demo-object --out /dev/null 2>&1 | tail -1 || true
echo
echo "demo: cluster running (masters: $MASTERS). Try (with the demo's tokens and certificates):"
echo "  export CRESCENT_TOKEN_FILE=$CRESCENT_TOKEN_FILE CRESCENT_ADMIN_TOKEN_FILE=$CRESCENT_ADMIN_TOKEN_FILE"
echo "  export CRESCENT_TLS_CERT=$CRESCENT_TLS_CERT CRESCENT_TLS_KEY=$CRESCENT_TLS_KEY CRESCENT_TLS_CA=$CRESCENT_TLS_CA${CRESCENT_ETCD_TLS:+ CRESCENT_ETCD_TLS=1}"
echo "  $BIN/crescentctl --master $MASTERS status"
echo "  $BIN/crescentctl --master $MASTERS put hello world && $BIN/crescentctl --master $MASTERS get hello"
echo "Press Ctrl-C to stop."
while true; do sleep 3600; done
