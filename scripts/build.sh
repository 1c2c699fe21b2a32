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
if [ ! -f "$dir/CMakeCache.txt" ]; then
  cmake -S . -B "$dir" "${generator[@]}" -DCMAKE_BUILD_TYPE=RelWithDebInfo "$@"
elif [ $# -gt 0 ]; then
  cmake -S . -B "$dir" "$@"
fi
cmake --build "$dir" --parallel "$(nproc)"
