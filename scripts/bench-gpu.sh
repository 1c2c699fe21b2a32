#!/usr/bin/env bash
# dtrain's training step on the GPU beside PyTorch on the same GPU, in one run: the tutorial CNN
# (SGD momentum 0.9, fp32 master weights) at each precision (float32 without TF32, tf32,
# mixed_bfloat16, mixed_float16) and batch 64, 256 and 1024; dtrain with its CUDA graph and launch
# by launch, PyTorch eager, with a CUDA graph, and compiled; and the floor per precision from the
# FLOPs and bytes a step must move at this GPU's measured matmul rate and copy bandwidth.
#   bash scripts/bench-gpu.sh [BUNDLE_DIR] [STEPS]
# BUNDLE_DIR: a folder from scripts/bundle.sh (its env.sh is sourced); without one, build-gpu/.
# Environment: PRECISIONS and BATCHES (lists, spaces or commas) narrow the runs; COMPILED_BATCHES
# (default: the last of BATCHES) are the batches torch.compile runs, for float32 and
# mixed_bfloat16 only, since each compile takes 20-40 s.
# Time on an H100 at the default 300 steps, about 1.5-3 min: 24 dtrain runs of 1-3 s each (start-up
# dominates; each is cut off after 60 s), 24 PyTorch eager and graph runs of about 1 s, two
# compiles, and the floor's four matmul rates. Compiling every batch would add 2-3 min.
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
precisions=${PRECISIONS:-float32 tf32 mixed_bfloat16 mixed_float16}
batches=${BATCHES:-64 256 1024}
read -ra precision_list <<<"${precisions//,/ }"
read -ra batch_list <<<"${batches//,/ }"
compiled_batches=${COMPILED_BATCHES:-${batch_list[-1]}}
# The job's model with PyTorch's optimizer: SGD at a constant 0.01 with momentum 0.9 (the job's
# cosine decay changes the rate every step, which keeps dtrain's step out of a CUDA graph).
constant_config=$(mktemp --suffix=.json)
trap 'rm -f "$constant_config"' EXIT
python3 - "$config" "$constant_config" <<'PY'
import json, sys
c = json.load(open(sys.argv[1]))
c["train"]["optimizer"] = {"type": "sgd", "learning_rate": 0.01, "momentum": 0.9}
json.dump(c, open(sys.argv[2], "w"))
PY
config=$constant_config
commas() { local IFS=,; echo "$*"; }

# One dtrain run: PRECISION BATCH MODE. Prints its row, or a '#' line when it fails.
dtrain_row() {
  local out rc=0 tag b ms sps gf peak got
  out=$(timeout 60 "$bench" "$config" "$2" "$steps" cuda "$3" "$1") || rc=$?
  read -r tag b ms sps gf peak got <<<"$(grep -m1 '^dtrain ' <<<"$out" || true)"
  if [ "$rc" -ne 0 ]; then
    echo "# dtrain $1 $2 failed: mode $3, exit $rc"
  elif [ "${tag:-}" != dtrain ]; then
    echo "# dtrain $1 $2 failed: mode $3, no result line"
  else
    echo "dtrain $got $1 $b $ms $sps $gf $peak"
  fi
}

echo "# scripts/bench-gpu.sh: tutorial CNN, SGD momentum 0.9; $steps timed steps after 10 warm-up"
nvidia-smi --query-gpu=name --format=csv,noheader | sed 's/^/# GPU: /'
echo "impl mode precision batch ms_per_step samples_per_s gflops sgemm_peak_gflops"
for precision in "${precision_list[@]}"; do
  for batch in "${batch_list[@]}"; do
    for mode in graphs eager; do
      dtrain_row "$precision" "$batch" "$mode"
    done
  done
done
"$python" "$torch_script" --steps "$steps" --precision "$(commas "${precision_list[@]}")" \
  --batches "$(commas "${batch_list[@]}")" --compiled-batches "${compiled_batches// /,}" \
  | grep -v '^framework' || echo "# torch script failed: exit $?"
"$python" "$torch_script" --floor --precision "$(commas "${precision_list[@]}")" \
  --batches "$(commas "${batch_list[@]}")" || echo "# torch floor failed: exit $?"
