#!/usr/bin/env bash
# scripts/chaos_events.py, which scripts/chaos.sh uses to judge a chaos run (issue 43 item 21): a
# run whose every `frozen` verdict names a worker the script stopped passes; one with a verdict
# against a worker it never stopped (a healthy worker killed) fails, naming that verdict; a
# verdict without a task (a link down, nobody blamed) is no worker's. Hand-made events.
#   chaos_events_check.sh SOURCE_DIR
set -euo pipefail
script=$1/scripts/chaos_events.py
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
cat > "$work/events.jsonl" <<'JSON'
{"event":"spawn","task":"worker:1","pid":100}
{"event":"stall","task":"worker:1","pid":100,"why":"stopped"}
{"event":"frozen","task":"worker:1","pid":100,"worker_pid":100,"why":"stopped"}
{"event":"frozen","attempt":0,"why":"every member has waited 20.0 s inside collective 7: a link is down"}
{"event":"recovered","path":"in_place","seconds":0.5,"steps_redone":1}
JSON
printf '100\n' > "$work/stopped"
out=$(/usr/bin/python3 "$script" "$work/events.jsonl" "$work/stopped")
echo "$out" | grep -q "2 frozen found (0 of them healthy, 1 stall warnings)" ||
  { echo "FAIL: unexpected summary: $out"; exit 1; }
[ ! -s "$work/stopped.wrong" ] || { echo "FAIL: a stopped worker counted as healthy"; exit 1; }

# A remote worker: pid is the ssh client, worker_pid the worker the script stopped.
echo '{"event":"frozen","task":"worker:2","pid":555,"worker_pid":200,"why":"stopped"}' \
  >> "$work/events.jsonl"
printf '100\n200\n' > "$work/stopped"
/usr/bin/python3 "$script" "$work/events.jsonl" "$work/stopped" >/dev/null ||
  { echo "FAIL: a stopped remote worker counted as healthy"; exit 1; }

# A healthy worker killed as frozen: the run fails and the verdict is listed.
echo '{"event":"frozen","task":"worker:0","pid":300,"worker_pid":300,"why":"busy"}' \
  >> "$work/events.jsonl"
if out=$(/usr/bin/python3 "$script" "$work/events.jsonl" "$work/stopped"); then
  echo "FAIL: a healthy worker killed as frozen passed: $out"; exit 1
fi
echo "$out" | grep -q "(1 of them healthy" || { echo "FAIL: not counted: $out"; exit 1; }
grep -q '"worker_pid": 300' "$work/stopped.wrong" || { echo "FAIL: not listed"; exit 1; }
echo "chaos_events_check: 3 of 3 cases passed"
