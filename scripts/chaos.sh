#!/usr/bin/env bash
# Chaos test of recovery in place (docs/design.md#in-place-recovery): the main job trained once
# undisturbed, then again under N faults sent to random training workers at random times, each a
# SIGKILL, a SIGTERM (that worker alone is preempted) or a SIGSTOP (never continued: the freeze
# watch must find it). Passes when both runs exit 0 with the same final model hash, all N faults
# were sent while the job ran, every `frozen` verdict named a worker this script stopped (a
# healthy worker killed as frozen fails the run), and no process of either run is left.
#
#   scripts/chaos.sh [--faults N] [--epochs E] [--steps S] [--spares K] [--hosts] [--busy B]
#                    [--build DIR]
#
#   --faults N   faults to send (default 100)
#   --epochs E   epochs of the job (default: 20 of 469 steps alone, 8 of 200 steps with --hosts)
#   --steps S    steps per epoch (default: the data set's, 469; 200 with --hosts)
#   --spares K   standby workers (default 0)
#   --hosts      two hosts: network namespaces with sshd (dtrain-testbed), two workers on each,
#                the launcher on the first; the second's workers start over ssh (needs root)
#   --busy B     keep B competing CPU-bound processes spinning through both runs (default 0), so
#                the workers are short of CPU as on a shared machine
#   --build DIR  the build to use (default build)
set -euo pipefail
cd "$(dirname "$0")/.."
faults=100 epochs="" steps="" spares=0 hosts=0 busy=0 build=build
while [ $# -gt 0 ]; do
  case "$1" in
    --faults) faults=$2; shift 2 ;;
    --epochs) epochs=$2; shift 2 ;;
    --steps) steps=$2; shift 2 ;;
    --spares) spares=$2; shift 2 ;;
    --hosts) hosts=1; shift ;;
    --busy) busy=$2; shift 2 ;;
    --build) build=$2; shift 2 ;;
    -h|--help) sed -n '2,20p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
    *) echo "chaos.sh: unknown argument \"$1\" (see --help)" >&2; exit 2 ;;
  esac
done
for n in "$faults" "$spares" "$busy" ${epochs:+"$epochs"} ${steps:+"$steps"}; do
  [[ "$n" =~ ^[0-9]+$ ]] || { echo "chaos.sh: \"$n\" is not a number" >&2; exit 2; }
done
if [ "$hosts" = 1 ]; then epochs=${epochs:-8}; steps=${steps:-200}; else epochs=${epochs:-20}; fi
bash scripts/build.sh "$build" >/dev/null
[ "$hosts" = 1 ] && { ninja -C "$build" dtrain-testbed >/dev/null 2>&1 || cmake --build "$build" --target dtrain-testbed >/dev/null; }
root=$(pwd)
dtrain=$root/$build/launcher/dtrain
py=/usr/bin/python3
work=$(mktemp -d /tmp/dtrain-chaos-XXXXXX)
prefix=()
testbed_pid=""
spinners=()
cleanup() {
  [ ${#spinners[@]} -eq 0 ] || { kill "${spinners[@]}" 2>/dev/null || true; wait "${spinners[@]}" 2>/dev/null || true; }
  if [ -n "$testbed_pid" ]; then exec {bed_in}>&- 2>/dev/null || true; kill "$testbed_pid" 2>/dev/null || true; wait "$testbed_pid" 2>/dev/null || true; fi
}
trap cleanup EXIT

if [ "$hosts" = 1 ]; then
  # The test bed lives as long as its stdin stays open.
  coproc BED { "$root/$build/test/helpers/dtrain-testbed" hosts 2; }
  testbed_pid=$BED_PID
  exec {bed_in}>&"${BED[1]}"
  declare -A bed
  while IFS='=' read -r -t 30 key value <&"${BED[0]}"; do
    bed[$key]=$value
    [ "$key" = ready ] && break
  done
  [ "${bed[ready]:-}" = 1 ] || { echo "chaos: the two-host test bed did not come up" >&2; exit 1; }
  prefix=(ip netns exec "${bed[netns0]}")
  cluster="[\"${bed[host0]}:23456\", \"${bed[host0]}:23457\", \"${bed[host1]}:23456\", \"${bed[host1]}:23457\"]"
  remote_shell=${bed[remote_shell]}
  echo "== two hosts: ${bed[host0]} (launcher, 2 workers) and ${bed[host1]} (2 workers over ssh)"
else
  cluster="" remote_shell=""
fi

# The main job with epoch checkpoints only: a recovery in place redoes at most the step in flight.
"$py" - "$work/job.json" "$epochs" "${steps:-0}" "$spares" "$cluster" "$remote_shell" <<'PY'
import json, sys
path, epochs, steps, spares, cluster, remote_shell = sys.argv[1:]
job = json.load(open("configs/fashion-mnist-2workers.json"))
job["job"] = "chaos"
if cluster:
    job.pop("workers", None)
    job["cluster"] = {"worker": json.loads(cluster)}
    job["remote_shell"] = json.loads(remote_shell)
else:
    job.pop("cluster", None)
    job["workers"] = 2
job["spares"] = int(spares)
job["restart"] = {"max_restarts": 1000, "max_preemptions": 1000, "backoff_seconds": 0.2,
                  "grace_seconds": 10}
job["train"]["epochs"] = int(epochs)
if int(steps):
    job["train"]["steps_per_epoch"] = int(steps)
job["train"]["backup"] = {"dir": "backup", "save_freq": "epoch", "keep": 2, "delete_on_success": True}
json.dump(job, open(path, "w"), indent=1)
PY

# Pids of the run's live training workers (dtrain-worker, not a spare, not stopped), on any host
# (the namespaces share this machine's pid space).
workers_of() {
  "$py" - "$1" <<'PY'
import os, sys
run = sys.argv[1]
for pid in os.listdir("/proc"):
    if not pid.isdigit():
        continue
    try:
        if open(f"/proc/{pid}/comm").read().strip() != "dtrain-worker":
            continue
        state = open(f"/proc/{pid}/stat").read().rsplit(")", 1)[1].split()[0]
        env = open(f"/proc/{pid}/environ", "rb").read().split(b"\0")
    except OSError:
        continue
    if state in "TtZ" or f"DTRAIN_RUN_DIR={run}".encode() not in env:
        continue
    if any(e.startswith(b"DTRAIN_SPARE=") for e in env):
        continue
    print(pid)
PY
}
# Every process whose environment names the work folder (workers, agents' children, spares).
left_of() {
  "$py" - "$work" <<'PY'
import os, sys
needle = sys.argv[1].encode()
n = 0
for pid in os.listdir("/proc"):
    if pid.isdigit() and int(pid) != os.getpid():
        try:
            if needle in open(f"/proc/{pid}/environ", "rb").read():
                n += 1
        except OSError:
            pass
print(n)
PY
}

# Competing CPU-bound processes, outside the runs (their environment does not name $work).
for _ in $(seq 1 "$busy"); do
  (exec "$py" -c 'while True: pass') &
  spinners+=($!)
done
[ "$busy" -eq 0 ] || echo "== $busy competing CPU-bound process(es) spinning"

start=$(date +%s.%N)
echo "== undisturbed run ($epochs epochs${steps:+ of $steps steps})"
"${prefix[@]}" "$dtrain" launch "$work/job.json" --run-dir "$work/calm" > "$work/calm.log" 2>&1 ||
  { tail -n 20 "$work/calm.log"; echo "chaos: FAIL: the undisturbed run failed; work folder $work"; exit 1; }
calm_wall=$(awk -v a="$start" -v b="$(date +%s.%N)" 'BEGIN { printf "%.1f", b - a }')
calm=$(sha256sum "$work/calm/model/model.safetensors" | cut -d' ' -f1)
echo "model $calm ($calm_wall s)"

echo "== run under $faults random SIGKILL/SIGTERM/SIGSTOP"
chaos_start=$(date +%s.%N)
"${prefix[@]}" "$dtrain" launch "$work/job.json" --run-dir "$work/chaos" > "$work/chaos.log" 2>&1 &
launcher=$!
declare -A sent_by=([KILL]=0 [TERM]=0 [STOP]=0)
sent=0
: > "$work/stopped.pids"  # every pid sent SIGSTOP: the only workers the freeze watch may name
while [ $sent -lt "$faults" ] && kill -0 $launcher 2>/dev/null; do
  sleep "$(awk -v r=$RANDOM 'BEGIN { printf "%.2f", 0.5 + (r % 150) / 100 }')"
  mapfile -t pids < <(workers_of "$work/chaos")
  [ ${#pids[@]} -gt 0 ] || continue
  pid=${pids[$((RANDOM % ${#pids[@]}))]}
  sig=$(case $((RANDOM % 3)) in 0) echo KILL ;; 1) echo TERM ;; *) echo STOP ;; esac)
  [ "$sig" = STOP ] && echo "$pid" >> "$work/stopped.pids"
  if kill -s "$sig" "$pid" 2>/dev/null; then
    sent=$((sent + 1)); sent_by[$sig]=$((sent_by[$sig] + 1))
    echo "fault $sent: SIG$sig to pid $pid"
  fi
done
wait $launcher && status=0 || status=$?
chaos_wall=$(awk -v a="$chaos_start" -v b="$(date +%s.%N)" 'BEGIN { printf "%.1f", b - a }')
chaos=$(sha256sum "$work/chaos/model/model.safetensors" 2>/dev/null | cut -d' ' -f1 || echo none)
# Host 1's agents and what a teardown left get their seconds to go (keep-alive 10 s, then 2 s).
for _ in $(seq 1 75); do [ "$(left_of)" -eq 0 ] && break; sleep 0.2; done
left=$(left_of)
summary=$("$py" scripts/chaos_events.py "$work/chaos/events.jsonl" "$work/stopped.pids" || true)
echo "launcher exit $status; faults: ${sent_by[KILL]} SIGKILL, ${sent_by[TERM]} SIGTERM, ${sent_by[STOP]} SIGSTOP"
echo "events: $summary"
echo "wall: undisturbed $calm_wall s, under faults $chaos_wall s; $left process(es) of the runs left"
echo "models: undisturbed $calm"
echo "        chaos       $chaos"
tail -n 4 "$work/chaos.log"
healthy_killed=$(wc -l < "$work/stopped.pids.wrong")
if [ "$healthy_killed" -gt 0 ]; then
  echo "chaos: the freeze watch killed $healthy_killed worker(s) this script never stopped:"
  cat "$work/stopped.pids.wrong"
fi
if [ "$status" -eq 0 ] && [ "$calm" = "$chaos" ] && [ "$left" -eq 0 ] && [ "$sent" -eq "$faults" ] &&
  [ "$healthy_killed" -eq 0 ]; then
  echo "chaos: PASS ($(awk -v a="$start" -v b="$(date +%s.%N)" 'BEGIN { printf "%.0f", b - a }') s); work folder $work"
else
  [ "$sent" -eq "$faults" ] || echo "chaos: only $sent of $faults faults were sent before the job ended: raise --epochs"
  echo "chaos: FAIL; work folder $work"
  exit 1
fi
