#!/usr/bin/env bash
# Launcher latencies with 8 real worker processes: worker death -> noticed, -> group stopped,
# -> whole group running again (back-off 0), and worker write -> `dtrain logs -f` output.
#   scripts/bench-launcher.sh [WORKERS] [TRIALS]
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/build.sh build >/dev/null
work=$(mktemp -d /tmp/dtrain-bench-launcher-XXXXXX)
trap 'rm -rf "$work"' EXIT
./build/bench/launcher_latency "$PWD/build/launcher/dtrain" "$PWD/build/test/helpers/dtrain-test-worker" \
  "$work" "${1:-8}" "${2:-30}"
