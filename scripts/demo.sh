#!/usr/bin/env bash
# Sets up, builds and runs the main job: two workers training Fashion-MNIST on this machine.
#   scripts/demo.sh [JOB_FILE]   (default configs/fashion-mnist-2workers.json)
set -euo pipefail
cd "$(dirname "$0")/.."
job=${1:-configs/fashion-mnist-2workers.json}
bash scripts/setup.sh
bash scripts/build.sh build
./build/launcher/dtrain validate "$job"
exec ./build/launcher/dtrain launch "$job"
