#!/usr/bin/env bash
# Training-step time of the tutorial CNN (configs/fashion-mnist-2workers.json's model): dtrain on
# oneDNN beside PyTorch's CPU build (Debian's python3-torch, with OpenBLAS as the system BLAS:
# Debian's torch is built with BLAS_INFO=generic and would otherwise use the reference BLAS),
# batch 64 and 256, 1 and 2 threads, all in one run, with the machine's sgemm peak.
#   scripts/bench-step.sh [STEPS]
set -euo pipefail
cd "$(dirname "$0")/.."
steps=${1:-50}
bash scripts/build.sh build >/dev/null
if ! /usr/bin/python3 -c "import torch" 2>/dev/null || ! dpkg -s libopenblas0-pthread >/dev/null 2>&1; then
  echo "# installing python3-torch and libopenblas0-pthread for the comparison" >&2
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends python3-torch libopenblas0-pthread >/dev/null
fi
echo "# scripts/bench-step.sh: tutorial CNN, SGD momentum 0.9, $steps timed steps after 10 warm-up"
echo "impl threads batch ms_per_step samples_per_s gflops sgemm_peak_gflops"
for threads in 1 2; do
  for batch in 64 256; do
    read -r _ b ms sps gf peak _ < <(OMP_NUM_THREADS=$threads ./build/bench/step_bench configs/fashion-mnist-2workers.json "$batch" "$steps")
    echo "dtrain $threads $b $ms $sps $gf $peak"
    read -r impl b ms sps < <(OMP_NUM_THREADS=$threads /usr/bin/python3 bench/step_torch.py "$batch" "$threads" "$steps")
    echo "$impl $threads $b $ms $sps - -"
  done
done
