#!/usr/bin/env bash
# Before and after in one run (issue 47, must-show 4): two launcher builds, for example commit
# d7c44ae's ("before") and this tree's ("after"), side by side in three benchmarks, every
# measurement alternating between the two run by run, and their three tables printed:
#   scripts/bench-spawn.sh     spawn span and wall time of "workers": N jobs of /bin/true
#   scripts/bench-recovery.sh  SIGKILL of one of two workers to the group's first step after a
#                              whole-group restart, by phase (median and spread over RUNS)
#   scripts/bench-churn.sh     goodput of the dtrain systems (in_place, in_place+spare, restart;
#                              no torchrun), calm and with a worker SIGKILLed every K seconds
# "After is no slower": its rows are no higher than before's beyond the spread between runs.
# Small sizes by default, under 10 minutes on 2 cores; K = 6 s lets the restart system finish
# (the main job allows 3 restarts; at K = 4 s on a busy machine both builds ran out of them).
#   scripts/bench-before-after.sh --before PATH [--after PATH] [--runs 5]
#       [--workers 64,256,1024,4096] [--epochs 6] [--steps 60] [--every 6]
# PATH: a dtrain launcher; its dtrain-worker is beside it or in ../worker (where the launcher
# looks). Nothing is built when both are given; without --after, this tree's build-cpu/ (dtrain
# and dtrain-worker, CPU only) is built first. A "before" build:
#   git worktree add --detach ../before d7c44ae && cd ../before &&
#   cmake -S . -B build-cpu -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo -DDTRAIN_WITH_CUDA=OFF &&
#   cmake --build build-cpu --target dtrain dtrain-worker
set -euo pipefail
before='' after='' runs=5 workers=64,256,1024,4096 epochs=6 steps=60 every=6
while [ $# -gt 0 ]; do
  case "$1" in -h|--help) sed -n '1d; /^#/!q; s/^# \{0,1\}//p' "$0"; exit 0 ;; esac
  [ $# -ge 2 ] || { echo "$1 needs a value (--help)" >&2; exit 2; }
  case "$1" in
    --before) before=$2 ;;
    --after) after=$2 ;;
    --runs) runs=$2 ;;
    --workers) workers=$2 ;;
    --epochs) epochs=$2 ;;
    --steps) steps=$2 ;;
    --every) every=$2 ;;
    *) echo "unknown argument $1 (--help)" >&2; exit 2 ;;
  esac
  shift 2
done
[ -n "$before" ] || { echo "--before PATH is required (--help)" >&2; exit 2; }
before=$(realpath "$before")
[ -z "$after" ] || after=$(realpath "$after")
cd "$(dirname "$0")/.."

if [ -z "$after" ]; then  # configured as scripts/build.sh does, but only the two programs built
  if [ ! -f build-cpu/CMakeCache.txt ]; then
    configure=(-DCMAKE_BUILD_TYPE=RelWithDebInfo -DDTRAIN_WITH_CUDA=OFF)
    command -v ninja >/dev/null 2>&1 && configure+=(-G Ninja)
    command -v ccache >/dev/null 2>&1 &&
      configure+=("-DCMAKE_CXX_COMPILER_LAUNCHER=env;CCACHE_BASEDIR=$PWD;CCACHE_NOHASHDIR=1;ccache")
    cmake -S . -B build-cpu "${configure[@]}" >&2
  fi
  cmake --build build-cpu --parallel "$(nproc)" --target dtrain dtrain-worker >&2
  after=$PWD/build-cpu/launcher/dtrain
fi

# Which commit a launcher was built from, when its build folder lies in a git checkout.
describe() {
  git -C "$(dirname "$1")" describe --always --dirty --abbrev=7 2>/dev/null || echo '?'
}
for side in before after; do
  path=${!side}
  [ -x "$path" ] || { echo "--$side $path: not an executable" >&2; exit 2; }
  echo "# $side: $path (checkout at $(describe "$path"))"
done
compare=(--dtrain "before=$before" --dtrain "after=$after")
started=$SECONDS

echo
echo "## spawn: scripts/bench-spawn.sh ${workers//,/ }"
IFS=, read -ra counts <<<"$workers"
bash scripts/bench-spawn.sh "${compare[@]}" "${counts[@]}"

echo
echo "## recovery: scripts/bench-recovery.sh, $runs runs"
bash scripts/bench-recovery.sh "${compare[@]}" "$runs"

echo
echo "## churn: scripts/bench-churn.sh, $epochs epochs x $steps steps, a kill every $every s"
bash scripts/bench-churn.sh "${compare[@]}" --systems in_place,in_place+spare,restart \
  --epochs "$epochs" --steps "$steps" --every "$every" --timeout 300

echo
echo "# scripts/bench-before-after.sh: $((SECONDS - started)) s"
