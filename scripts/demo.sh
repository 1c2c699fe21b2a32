#!/usr/bin/env bash
# Sets up what building and running dtrain needs (scripts/setup.sh --minimal), builds only
# `dtrain` and `dtrain-worker` in build-demo/, installs them in /usr/local/bin (on PATH) with the
# bash completion (scripts/install.sh), then runs the main job: two workers training Fashion-MNIST
# here. It builds no test and runs none; scripts/test.sh does that.
#   scripts/demo.sh [JOB_FILE]   (default configs/fashion-mnist-2workers.json)
# DTRAIN_PREFIX installs elsewhere than /usr/local.
set -euo pipefail
cd "$(dirname "$0")/.."
job=${1:-configs/fashion-mnist-2workers.json}
prefix=${DTRAIN_PREFIX:-/usr/local}
dir=build-demo
bash scripts/setup.sh --minimal

# The configuration this machine can run: CMake's own choice (the CUDA backend when it finds
# CUDA, cuDNN and NCCL) where nvidia-smi lists a GPU, CPU-only otherwise.
gpu=
if command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi -L 2>/dev/null | grep -q '^GPU '; then
  gpu=yes
fi
if [ ! -f "$dir/CMakeCache.txt" ]; then
  options=(-DCMAKE_BUILD_TYPE=RelWithDebInfo -DBUILD_TESTING=OFF)
  # The tested build's code (-O2) without its debug information: about a quarter less compile
  # time, and the programs link in seconds.
  options+=(-DCMAKE_CXX_FLAGS_RELWITHDEBINFO="-O2 -DNDEBUG"
            -DCMAKE_CUDA_FLAGS_RELWITHDEBINFO="-O2 -DNDEBUG")
  [ -z "$gpu" ] && options+=(-DDTRAIN_WITH_CUDA=OFF)
  command -v ninja >/dev/null 2>&1 && options+=(-G Ninja)
  # ccache when present, as scripts/build.sh uses it (a fresh machine has none).
  if command -v ccache >/dev/null 2>&1; then
    options+=("-DCMAKE_CXX_COMPILER_LAUNCHER=env;CCACHE_BASEDIR=$PWD;CCACHE_NOHASHDIR=1;ccache")
  fi
  mkdir -p "$dir"
  if ! cmake -S . -B "$dir" "${options[@]}" >"$dir/configure.log" 2>&1; then
    tail -n 20 "$dir/configure.log" >&2
    rm -f "$dir/CMakeCache.txt"  # so that the next run configures again
    echo "demo: cmake failed (full log: $dir/configure.log)" >&2
    exit 1
  fi
fi
if grep -q '^DTRAIN_WITH_CUDA:[A-Z]*=ON$' "$dir/CMakeCache.txt"; then
  echo "demo: building dtrain and dtrain-worker in $dir/ with the CUDA backend (a GPU is present)"
elif [ -n "$gpu" ]; then
  echo "demo: building dtrain and dtrain-worker in $dir/, CPU-only: a GPU is present but CUDA," \
       "cuDNN or NCCL was not found"
else
  echo "demo: building dtrain and dtrain-worker in $dir/, CPU-only (no GPU)"
fi
cmake --build "$dir" --target dtrain dtrain-worker --parallel "$(nproc)"

bash scripts/install.sh "$prefix" "$dir"
# The launch checks the job file as `dtrain validate` does before it starts anything.
exec "$prefix/bin/dtrain" launch "$job"
