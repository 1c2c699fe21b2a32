#!/usr/bin/env bash
# Ring all-reduce over loopback TCP for N processes (started by `dtrain launch`), 4 KiB to
# 64 MiB, with the machine's bounds (memcpy, point-to-point TCP) measured in the same run.
#   scripts/bench-allreduce.sh N [MAX_BYTES]
set -euo pipefail
cd "$(dirname "$0")/.."
n=${1:-2}
max=${2:-67108864}
bash scripts/build.sh build >/dev/null
work=$(mktemp -d /tmp/dtrain-bench-allreduce-XXXXXX)
trap 'rm -rf "$work"' EXIT
cat > "$work/job.json" <<JOB
{"job": "bench-allreduce", "workers": $n, "run_dir": "$work/run",
 "command": ["$PWD/build/bench/allreduce_bench", "$work/table.txt", "$max"],
 "restart": {"max_restarts": 0}, "env": {"DTRAIN_LOG_LEVEL": "warn"}}
JOB
./build/launcher/dtrain launch "$work/job.json" > "$work/launch.log" 2>&1 || { cat "$work/launch.log"; exit 1; }
echo "# scripts/bench-allreduce.sh $n ($(nproc) cores)"
cat "$work/table.txt"
