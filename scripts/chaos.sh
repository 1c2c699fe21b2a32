#!/usr/bin/env bash
# Chaos test of the main job: the two-worker Fashion-MNIST job trained once undisturbed, then
# again under N random SIGKILLs and SIGTERMs of random workers at random times. Passes when both
# runs end with the same final model hash, no process of either run is left, and events.jsonl
# shows the restarts.   scripts/chaos.sh [N=20] [EPOCHS=2]
set -euo pipefail
cd "$(dirname "$0")/.."
n=${1:-20}
epochs=${2:-2}
bash scripts/build.sh build >/dev/null
work=$(mktemp -d /tmp/dtrain-chaos-XXXXXX)
# The main job with step checkpoints every 50 steps, so each interruption costs little.
python3 - "$work/job.json" "$epochs" <<'PY'
import json, sys
job = json.load(open("configs/fashion-mnist-2workers.json"))
job["job"] = "chaos"
job["cluster"] = None; del job["cluster"]; job["workers"] = 2
job["restart"] = {"max_restarts": 5, "max_preemptions": 1000, "backoff_seconds": 0.2, "grace_seconds": 10}
job["train"]["epochs"] = int(sys.argv[2])
job["train"]["backup"] = {"dir": "backup", "save_freq": 50, "keep": 2, "delete_on_success": True}
json.dump(job, open(sys.argv[1], "w"), indent=1)
PY
dtrain=./build/launcher/dtrain
start=$(date +%s)
echo "== undisturbed run"
$dtrain launch "$work/job.json" --run-dir "$work/calm" > "$work/calm.log" 2>&1
calm=$(sha256sum "$work/calm/model/model.safetensors" | cut -d' ' -f1)
echo "model $calm ($(( $(date +%s) - start )) s)"

echo "== run under $n random SIGKILL/SIGTERM"
$dtrain launch "$work/job.json" --run-dir "$work/chaos" > "$work/chaos.log" 2>&1 &
launcher=$!
sent=0
while [ $sent -lt "$n" ] && kill -0 $launcher 2>/dev/null; do
  sleep "$(awk -v r=$RANDOM 'BEGIN { printf "%.2f", 0.5 + (r % 300) / 100 }')"
  pid=$(python3 -c "import json,sys; s=json.load(open(sys.argv[1])); w=[x for x in s['workers'] if x['state']=='running']; import random; print(random.choice(w)['pid'] if w else '')" "$work/chaos/state.json" 2>/dev/null || true)
  [ -n "$pid" ] || continue
  sig=$([ $((RANDOM % 2)) -eq 0 ] && echo KILL || echo TERM)
  if kill -s "$sig" "$pid" 2>/dev/null; then sent=$((sent + 1)); echo "signal $sent: SIG$sig to pid $pid"; fi
done
wait $launcher && status=0 || status=$?
chaos=$(sha256sum "$work/chaos/model/model.safetensors" 2>/dev/null | cut -d' ' -f1 || echo none)
restarts=$(grep -c '"event":"restart"' "$work/chaos/events.jsonl" || true)
left=$(pgrep -f "$work" | wc -l || true)
echo "launcher exit $status, $sent signals, $restarts restarts in events.jsonl, $left processes of the runs left"
echo "models: undisturbed $calm"
echo "        chaos       $chaos"
tail -n 4 "$work/chaos.log"
if [ "$status" -eq 0 ] && [ "$calm" = "$chaos" ] && [ "$left" -eq 0 ] && [ "$restarts" -ge 1 ]; then
  echo "chaos: PASS ($(( $(date +%s) - start )) s); work folder $work"
else
  echo "chaos: FAIL; work folder $work"
  exit 1
fi
