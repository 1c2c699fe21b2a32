#!/usr/bin/env bash
# The launcher's memory during a flood of junk connections to its control socket
# (bench/control_flood.py): resident memory each second, its peak, launcher.log's size, and
# whether the job survived.
#   scripts/bench-control-flood.sh [SECONDS=30] [FLOODERS=4] [BUILD=build]
set -euo pipefail
cd "$(dirname "$0")/.."
build=${3:-build}
bash scripts/build.sh "$build" >/dev/null
echo "# scripts/bench-control-flood.sh: $(nproc) cores, $(lscpu | sed -n 's/^Model name: *//p')"
python3 bench/control_flood.py "$build/launcher/dtrain" "${1:-30}" "${2:-4}"
