#!/usr/bin/env bash
# The PyTorch sides of the benchmarks (bench/step_torch.py --job, which builds a job's graph with
# bench/gpt_torch.py or bench/resnet_torch.py from examples/pytorch/load_dtrain_model.py) still
# build and step: one step at batch 4 of the character GPT and of the ResNet-20, each printing
# its figures line. A change to the loader's builder once broke both without a test noticing.
#   bench_torch_check.sh SOURCE_DIR
set -euo pipefail
cd "$1"
for job in configs/char-gpt-shakespeare.json configs/resnet-fashion-mnist.json; do
  out=$(OMP_NUM_THREADS=1 /usr/bin/python3 bench/step_torch.py 4 1 1 float32 --job "$job")
  echo "$job: $out"
  grep -q '^pytorch-' <<<"$out" || { echo "no figures line for $job" >&2; exit 1; }
done
