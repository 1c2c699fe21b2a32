#!/usr/bin/env bash
# dtrain's training step on the GPU beside PyTorch on the same GPU, in one run: the tutorial CNN
# (SGD momentum 0.9, fp32, no TF32) at batch 64, 256 and 1024; dtrain with its CUDA graph and
# launch by launch, PyTorch eager, with a CUDA graph, and compiled; and the floor from the FLOPs
# and bytes a step must move at this GPU's measured matmul rate and copy bandwidth.
#   bash scripts/bench-gpu.sh [BUNDLE_DIR] [STEPS]
# BUNDLE_DIR: a folder from scripts/bundle.sh (its env.sh is sourced); without one, build-gpu/.
set -euo pipefail
cd "$(dirname "$0")/.."
steps=${2:-300}
if [ -n "${1:-}" ]; then
  # shellcheck disable=SC1091
  source "$1/env.sh"
  bench=$1/bin/step_bench config=$1/configs/fashion-mnist-2workers.json torch_script=$1/scripts/step_torch_gpu.py
else
  bench=build-gpu/bench/step_bench config=configs/fashion-mnist-2workers.json torch_script=bench/step_torch_gpu.py
fi
python=${PYTHON:-python3}
echo "# scripts/bench-gpu.sh: tutorial CNN, SGD momentum 0.9, fp32; $steps timed steps after 10 warm-up"
nvidia-smi --query-gpu=name --format=csv,noheader | sed 's/^/# GPU: /'
echo "impl mode batch ms_per_step samples_per_s gflops sgemm_peak_gflops"
for batch in 64 256 1024; do
  for mode in graphs eager; do
    read -r _ b ms sps gf peak got < <("$bench" "$config" "$batch" "$steps" cuda "$mode")
    echo "dtrain $got $b $ms $sps $gf $peak"
  done
done
"$python" "$torch_script" --steps "$steps" | grep -v '^framework'
"$python" "$torch_script" --floor
