#!/usr/bin/env bash
# Spawn time of `"workers": N` jobs of /bin/true (issue 25): for each N, `dtrain launch` of the job
# with no restarts, printing the span from the first to the last "spawn" event of events.jsonl
# ("mono" seconds) and the launch's wall time. CPU-only build in build-cpu/.
#   scripts/bench-spawn.sh [--dtrain LABEL=PATH]... [N...]     (default N: 64 256 1024 4096)
# Each --dtrain adds a launcher binary to compare (for example one built from an older commit);
# every binary runs each N in turn, side by side in one run. Without --dtrain: build-cpu's.
set -euo pipefail
cd "$(dirname "$0")/.."
labels=() binaries=() counts=()
while [ $# -gt 0 ]; do
  case "$1" in
    --dtrain)
      [[ "${2:-}" == *=* ]] || { echo "--dtrain needs LABEL=PATH" >&2; exit 2; }
      labels+=("${2%%=*}") binaries+=("$(realpath "${2#*=}")")
      shift 2 ;;
    *) counts+=("$1"); shift ;;
  esac
done
if [ ${#binaries[@]} -eq 0 ]; then
  bash scripts/build.sh build-cpu -DDTRAIN_WITH_CUDA=OFF >/dev/null
  labels=(dtrain) binaries=("$PWD/build-cpu/launcher/dtrain")
fi
[ ${#counts[@]} -gt 0 ] || counts=(64 256 1024 4096)
work=$(mktemp -d /tmp/dtrain-bench-spawn-XXXXXX)
trap 'rm -rf "$work"' EXIT
# The launcher raises its soft descriptor limit to the hard one; say so when the hard one is low.
hard=$(ulimit -Hn)
if [ "$hard" != unlimited ] && [ "$hard" -lt $((3 * ${counts[-1]} + 64)) ]; then
  echo "# warning: hard RLIMIT_NOFILE $hard may be too low for ${counts[-1]} workers" >&2
fi
echo "# $(lscpu | sed -n 's/^Model name: *//p'), $(nproc) cores, load $(cut -d' ' -f1-3 /proc/loadavg)"
printf '%-10s %-8s %-9s %s\n' launcher workers span_s wall_s
for n in "${counts[@]}"; do
  for i in "${!binaries[@]}"; do
    label=${labels[$i]} run=$work/run-$i-$n job=$work/s$i-$n.json
    printf '{"job": "s%s", "workers": %s, "command": ["/bin/true"], "run_dir": "%s",\n' \
      "$n" "$n" "$run" >"$job"
    printf ' "restart": {"max_restarts": 0}}\n' >>"$job"
    start=$(date +%s.%N)
    (cd "$work" && "${binaries[$i]}" launch "$job" >"$work/out.log" 2>&1) ||
      { echo "launch of $n workers ($label) failed:" >&2; tail -5 "$work/out.log" >&2; exit 1; }
    end=$(date +%s.%N)
    span=$(python3 - "$run/events.jsonl" <<'PY'
import json, sys
mono = [e["mono"] for e in map(json.loads, open(sys.argv[1])) if e.get("event") == "spawn"]
print(f"{max(mono) - min(mono):.3f}" if mono else "nan")
PY
)
    printf '%-10s %-8s %-9s %.2f\n' "$label" "$n" "$span" "$(awk "BEGIN { print $end - $start }")"
    rm -rf "$run"
  done
done
