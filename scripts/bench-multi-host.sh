#!/usr/bin/env bash
# Start-up and recovery of a four-worker group on one host, on two hosts (network namespaces
# with sshd; the second host's workers start over ssh through `dtrain agent`) and as Slurm job
# steps on two nodes (a private slurmctld, two slurmd and munged), side by side.
# Needs root; prints a skip line otherwise.   scripts/bench-multi-host.sh [REPETITIONS=3] [BUILD]
set -euo pipefail
cd "$(dirname "$0")/.."
build=${2:-build}
bash scripts/build.sh "$build" >/dev/null
ninja -C "$build" multi_host_bench >/dev/null 2>&1 || cmake --build "$build" --target multi_host_bench >/dev/null
echo "# scripts/bench-multi-host.sh: $(nproc) cores"
"$build/bench/multi_host_bench" "${1:-3}"
