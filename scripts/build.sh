#!/usr/bin/env bash
# Configures and builds dtrain with CMake and Ninja.
#   scripts/build.sh [BUILD_DIR] [extra cmake args...]
# BUILD_DIR defaults to build/. The CUDA backend is on when CMake finds CUDA, cuDNN and NCCL;
# pass -DDTRAIN_WITH_CUDA=OFF for the CPU-only build.
set -euo pipefail
cd "$(dirname "$0")/.."
dir=${1:-build}
shift || true
generator=()
command -v ninja >/dev/null 2>&1 && generator=(-G Ninja)
# ccache when present, with paths taken relative to this checkout and the build directory left
# out of the hash: a second build directory (CI's build-cpu/ after build/) reuses every object
# compiled the same way, and a fresh clone in another directory reuses them too.
launcher=()
if command -v ccache >/dev/null 2>&1; then
  launcher=("-DCMAKE_CXX_COMPILER_LAUNCHER=env;CCACHE_BASEDIR=$PWD;CCACHE_NOHASHDIR=1;ccache")
fi
if [ ! -f "$dir/CMakeCache.txt" ]; then
  cmake -S . -B "$dir" "${generator[@]}" "${launcher[@]}" -DCMAKE_BUILD_TYPE=RelWithDebInfo "$@"
elif [ $# -gt 0 ]; then
  cmake -S . -B "$dir" "$@"
fi
cmake --build "$dir" --parallel "$(nproc)"
