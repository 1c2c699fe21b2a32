#!/usr/bin/env bash
# Spawn time of `"workers": N` jobs of /bin/true (issue 25): for each N, `dtrain launch` of the job
# with no restarts, printing the span from the first to the last "spawn" event of events.jsonl
# ("mono" seconds) and the launch's wall time. CPU-only build in build-cpu/.
#   scripts/bench-spawn.sh [N...]        (default: 64 256 1024 4096)
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/build.sh build-cpu -DDTRAIN_WITH_CUDA=OFF >/dev/null
dtrain=$PWD/build-cpu/launcher/dtrain
work=$(mktemp -d /tmp/dtrain-bench-spawn-XXXXXX)
trap 'rm -rf "$work"' EXIT
counts=("$@")
[ ${#counts[@]} -gt 0 ] || counts=(64 256 1024 4096)
# The launcher raises its soft descriptor limit to the hard one; say so when the hard one is low.
hard=$(ulimit -Hn)
if [ "$hard" != unlimited ] && [ "$hard" -lt $((3 * ${counts[-1]} + 64)) ]; then
  echo "# warning: hard RLIMIT_NOFILE $hard may be too low for ${counts[-1]} workers" >&2
fi
printf '%-8s %-9s %s\n' workers span_s wall_s
for n in "${counts[@]}"; do
  job=$work/s$n.json
  printf '{"job": "s%s", "workers": %s, "command": ["/bin/true"], "run_dir": "%s",\n' \
    "$n" "$n" "$work/run-$n" >"$job"
  printf ' "restart": {"max_restarts": 0}}\n' >>"$job"
  start=$(date +%s.%N)
  (cd "$work" && "$dtrain" launch "$job" >"$work/out-$n.log" 2>&1) ||
    { echo "launch of $n workers failed:" >&2; tail -5 "$work/out-$n.log" >&2; exit 1; }
  end=$(date +%s.%N)
  span=$(python3 - "$work/run-$n/events.jsonl" <<'PY'
import json, sys
mono = [e["mono"] for e in map(json.loads, open(sys.argv[1])) if e.get("event") == "spawn"]
print(f"{max(mono) - min(mono):.3f}" if mono else "nan")
PY
)
  printf '%-8s %-9s %.2f\n' "$n" "$span" "$(awk "BEGIN { print $end - $start }")"
done
