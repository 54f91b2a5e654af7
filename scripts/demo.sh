#!/usr/bin/env bash
# make demo: a local three-master Crescent cluster on loopback, a short
# workload, the leader, a leader kill and the new leader. Runs until Ctrl-C,
# then stops every process it started.
set -euo pipefail
cd "$(dirname "$0")/.."

BIN=./target/release
DIR=$(mktemp -d /tmp/crescent-demo.XXXXXX)
PIDS=()
cleanup() {
  echo
  echo "demo: stopping ${#PIDS[@]} processes, data in $DIR"
  for p in "${PIDS[@]}"; do kill "$p" 2>/dev/null || true; done
  for p in "${PIDS[@]}"; do wait "$p" 2>/dev/null || true; done
}
trap cleanup EXIT
trap 'exit 130' INT TERM

BASE=${CRESCENT_DEMO_PORT:-50051}
PEERS="1=127.0.0.1:$BASE,2=127.0.0.1:$((BASE + 1)),3=127.0.0.1:$((BASE + 2))"
MASTERS="127.0.0.1:$BASE,127.0.0.1:$((BASE + 1)),127.0.0.1:$((BASE + 2))"

start_master() {
  local id=$1
  "$BIN/crescent-master" --node-id "$id" --listen "127.0.0.1:$((BASE + id - 1))" \
    --http "127.0.0.1:$((9002 + id))" --data-dir "$DIR/master-$id" --peers "$PEERS" \
    >>"$DIR/master-$id.log" 2>&1 &
  PIDS+=($!)
  eval "MASTER_PID_$id=$!"
}

echo "demo: starting three masters (static --peers) in $DIR"
for id in 1 2 3; do start_master "$id"; done

for _ in $(seq 1 100); do
  if "$BIN/crescentctl" --master "$MASTERS" leader >/dev/null 2>&1; then break; fi
  sleep 0.1
done
"$BIN/crescentctl" --master "$MASTERS" leader

echo
echo "demo: a short metadata workload (3 000 objects, batches of 128)"
"$BIN/crescentctl" bench meta --masters "$MASTERS" --objects 3000 --single-objects 200 --batch 1,128 | grep -E "^(CLUSTER|given)"

echo
"$BIN/crescentctl" --master "$MASTERS" status

LEADER=$("$BIN/crescentctl" --master "$MASTERS" leader --json | sed -E 's/.*"leader_id":([0-9]+).*/\1/')
PID_VAR="MASTER_PID_$LEADER"
echo
echo "demo: killing the leader (node $LEADER, pid ${!PID_VAR}) with SIGKILL"
kill -9 "${!PID_VAR}"
wait "${!PID_VAR}" 2>/dev/null || true
START=$(date +%s%N)
for _ in $(seq 1 100); do
  NEW=$("$BIN/crescentctl" --master "$MASTERS" leader --json 2>/dev/null | sed -E 's/.*"leader_id":([0-9]+).*/\1/' || true)
  if [ -n "$NEW" ] && [ "$NEW" != "$LEADER" ]; then break; fi
  sleep 0.05
done
echo "demo: new leader after $(( ($(date +%s%N) - START) / 1000000 )) ms:"
"$BIN/crescentctl" --master "$MASTERS" leader
echo "demo: the workload continues on the new leader"
"$BIN/crescentctl" bench meta --masters "$MASTERS" --objects 2000 --batch 128 | grep -E "^(CLUSTER|given)"

echo
echo "demo: restarting node $LEADER; it rejoins as a follower"
start_master "$LEADER"
sleep 1
"$BIN/crescentctl" --master "$MASTERS" status
echo
echo "demo: cluster running (masters: $MASTERS). Press Ctrl-C to stop."
while true; do sleep 3600; done
