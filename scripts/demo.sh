#!/usr/bin/env bash
# Sets up, builds and installs dtrain (scripts/install.sh: `dtrain` and `dtrain-worker` in
# /usr/local/bin, on PATH), then runs the main job: two workers training Fashion-MNIST here.
#   scripts/demo.sh [JOB_FILE]   (default configs/fashion-mnist-2workers.json)
# DTRAIN_PREFIX installs elsewhere than /usr/local.
set -euo pipefail
cd "$(dirname "$0")/.."
job=${1:-configs/fashion-mnist-2workers.json}
prefix=${DTRAIN_PREFIX:-/usr/local}
bash scripts/setup.sh
bash scripts/install.sh "$prefix"
"$prefix/bin/dtrain" validate "$job"
exec "$prefix/bin/dtrain" launch "$job"
