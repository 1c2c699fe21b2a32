#!/usr/bin/env bash
# Recovery time broken down by phase: SIGKILL of one of two workers of the main job's model and
# data, to the group's first completed step after the restart (bench/recovery_breakdown.py).
#   scripts/bench-recovery.sh [RUNS=5] [BUILD=build]
set -euo pipefail
cd "$(dirname "$0")/.."
build=${2:-build}
bash scripts/build.sh "$build" >/dev/null
echo "# scripts/bench-recovery.sh: $(nproc) cores, build $build"
python3 bench/recovery_breakdown.py "$build/launcher/dtrain" "${1:-5}"
