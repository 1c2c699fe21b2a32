#!/usr/bin/env bash
# Sets up, builds and runs the whole test suite; this is what CI runs (.ci/run).
# Two builds: the default one (CUDA backend compiled when the toolkit is found; GPU tests say
# "no GPU" and skip without one) and the CPU-only one (-DDTRAIN_WITH_CUDA=OFF). Both run every test.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh --tests
jobs=$(nproc)
# setup.sh --tests installed python3-torch: the PyTorch tests fail here instead of skipping.
export DTRAIN_REQUIRE_PYTORCH=1

echo "== default build (build/) =="
bash scripts/build.sh build
ctest --test-dir build --output-on-failure --timeout 600 -j "$jobs"

echo "== CPU-only build (build-cpu/) =="
bash scripts/build.sh build-cpu -DDTRAIN_WITH_CUDA=OFF
ctest --test-dir build-cpu --output-on-failure --timeout 600 -j "$jobs"
