#!/usr/bin/env bash
# How long a SIGSTOPped, SIGKILLed or spinning worker takes to be found and recovered from, on a
# quiet machine and on one kept busy by competing CPU-bound processes (bench/freeze_detection.py),
# for this checkout's build and, with --before REV, a build of another revision side by side.
#   scripts/bench-freeze.sh [--runs R] [--busy B] [--before REV] [BUILD=build-cpu]
set -euo pipefail
cd "$(dirname "$0")/.."
runs=3 busy=2 before=""
while [ $# -gt 0 ]; do
  case "$1" in
    --runs) runs=$2; shift 2 ;;
    --busy) busy=$2; shift 2 ;;
    --before) before=$2; shift 2 ;;
    -*) echo "bench-freeze.sh: unknown option $1" >&2; exit 2 ;;
    *) break ;;
  esac
done
build=${1:-build-cpu}
cmake --build "$build" --target dtrain dtrain-worker >/dev/null
builds=(--build "now=$PWD/$build/launcher/dtrain")
no_spin=""
if [ -n "$before" ]; then
  # The other revision in a worktree of its own, built through the same ccache.
  old=/tmp/dtrain-bench-freeze-$(git rev-parse --short "$before")
  [ -d "$old" ] || git worktree add --detach "$old" "$before" >/dev/null
  [ -f "$old/build-cpu/CMakeCache.txt" ] || cmake -S "$old" -B "$old/build-cpu" -G Ninja \
    "-DCMAKE_CXX_COMPILER_LAUNCHER=env;CCACHE_BASEDIR=$old;CCACHE_NOHASHDIR=1;ccache" \
    -DCMAKE_BUILD_TYPE=RelWithDebInfo -DDTRAIN_WITH_CUDA=OFF >/dev/null
  cmake --build "$old/build-cpu" --target dtrain dtrain-worker >/dev/null
  builds+=(--build "before=$old/build-cpu/launcher/dtrain")
  grep -q DTRAIN_TEST_SPIN_AT_STEP "$old/common/env_vars.h" || no_spin=before
fi
echo "# scripts/bench-freeze.sh: $(nproc) cores, $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | xargs), busy $busy, runs $runs"
python3 bench/freeze_detection.py "${builds[@]}" --runs "$runs" --busy "$busy" --no-spin-for "$no_spin"
