#!/usr/bin/env bash
# Elastic membership on two hosts (network namespaces with sshd, two workers each): the step time
# at full membership without and with "elastic", alternated; then runs where the second host's
# link is cut and restored: the shrunk step time, the times from the cut to the first step of the
# smaller group and from the restore to the first step at full size, and whether the model is
# the undisturbed run's. Needs root; prints a skip line otherwise.
#   scripts/bench-elastic.sh [REPETITIONS=3] [BUILD] [FAULT_RUNS=2]
set -euo pipefail
cd "$(dirname "$0")/.."
build=${2:-build}
bash scripts/build.sh "$build" >/dev/null
ninja -C "$build" elastic_bench >/dev/null 2>&1 || cmake --build "$build" --target elastic_bench >/dev/null
echo "# scripts/bench-elastic.sh: $(lscpu | sed -n 's/^Model name: *//p'), $(nproc) cores"
"$build/bench/elastic_bench" "${1:-3}" "${3:-2}"
