#!/usr/bin/env bash
# Goodput under churn (issue 26): the main job's model and data trained by dtrain with in-place
# recovery, dtrain with whole-group restarts and torchrun (bench/cnn_ddp.py), each calm and with
# a random training worker SIGKILLed every K seconds, side by side in one run (bench/churn.py).
#   scripts/bench-churn.sh [--build DIR] [bench/churn.py options]
#   e.g. scripts/bench-churn.sh                      (12 epochs x 200 steps, K = 10 and 5)
#        scripts/bench-churn.sh --epochs 2 --steps 30 --every 3 --systems restart,torchrun
#        scripts/bench-churn.sh --dtrain before=../before/build-cpu/launcher/dtrain \
#          --dtrain after=build-cpu/launcher/dtrain --systems in_place,restart
# Installs OpenBLAS (Debian's torch otherwise runs on the reference BLAS, ten times slower) and
# torch if missing and torchrun runs, builds dtrain and dtrain-worker (BUILD: build/), and runs
# the benchmark. Each --dtrain LABEL=PATH adds a launcher to compare (dtrain-worker beside it or
# in ../worker): every dtrain system runs with each, alternating run by run; nothing is built.
set -euo pipefail
cd "$(dirname "$0")/.."
build=''
systems=in_place,in_place+spare,restart,torchrun  # bench/churn.py's default
args=() compared=()
while [ $# -gt 0 ]; do
  case $1 in
    --build) build=$2; shift 2 ;;
    --build=*) build=${1#--build=}; shift ;;
    --dtrain) compared+=(--dtrain "${2:-}"); shift 2 ;;
    --dtrain=*) compared+=("$1"); shift ;;
    --systems) systems=${2:-}; args+=("$1" "${2:-}"); shift 2 ;;
    --systems=*) systems=${1#--systems=}; args+=("$1"); shift ;;
    -h|--help)  # the options, without installing or building anything
      sed -n '2,13p' "$0" | sed 's/^# \{0,1\}//'
      exec /usr/bin/python3 bench/churn.py --help ;;
    *) args+=("$1"); shift ;;
  esac
done

if [[ ",$systems," == *,torchrun,* ]]; then
  sudo=()
  [ "$(id -u)" -eq 0 ] || sudo=(sudo)
  need=()
  dpkg -s libopenblas0-pthread >/dev/null 2>&1 || need+=(libopenblas0-pthread)
  [ -x /usr/bin/torchrun ] || need+=(python3-torch)
  if [ ${#need[@]} -gt 0 ]; then
    echo "# installing ${need[*]}" >&2
    "${sudo[@]}" env DEBIAN_FRONTEND=noninteractive timeout 900 apt-get install -y "${need[@]}" >&2
  fi
  # libblas.so.3 -> OpenBLAS (its priority makes it the automatic choice; a manual one may not).
  blas=/usr/lib/x86_64-linux-gnu/openblas-pthread/libblas.so.3
  if [ "$(readlink -f /usr/lib/x86_64-linux-gnu/libblas.so.3)" != "$blas" ]; then
    "${sudo[@]}" update-alternatives --set libblas.so.3-x86_64-linux-gnu "$blas" >&2
  fi
fi

if [ ${#compared[@]} -gt 0 ]; then
  [ -z "$build" ] || { echo "--dtrain and --build: one or the other" >&2; exit 2; }
  echo "# scripts/bench-churn.sh ${compared[*]}${args[*]:+ ${args[*]}}"
  exec /usr/bin/python3 bench/churn.py "${compared[@]}" ${args[@]+"${args[@]}"}
fi
build=${build:-build}

# Configured as scripts/build.sh does (ccache when present), but only the two programs built.
if [ ! -f "$build/CMakeCache.txt" ]; then
  configure=(-DCMAKE_BUILD_TYPE=RelWithDebInfo)
  command -v ninja >/dev/null 2>&1 && configure+=(-G Ninja)
  command -v ccache >/dev/null 2>&1 &&
    configure+=("-DCMAKE_CXX_COMPILER_LAUNCHER=env;CCACHE_BASEDIR=$PWD;CCACHE_NOHASHDIR=1;ccache")
  cmake -S . -B "$build" "${configure[@]}" >&2
fi
timeout 3600 cmake --build "$build" --parallel "$(nproc)" --target dtrain dtrain-worker >&2

commit=$(git rev-parse --short HEAD 2>/dev/null || echo '?')
echo "# scripts/bench-churn.sh${args[*]:+ ${args[*]}} (build $build, commit $commit)"
exec /usr/bin/python3 bench/churn.py --dtrain "$build/launcher/dtrain" ${args[@]+"${args[@]}"}
