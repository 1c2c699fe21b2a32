#!/usr/bin/env bash
# The GPU runs (issue 16), on a machine with an NVIDIA GPU, from the folder scripts/bundle.sh
# made: test_gpu (and once under compute-sanitizer), the Fashion-MNIST job on the GPU with one
# worker (NCCL, world size 1) and with two workers sharing the GPU (TCP ring staged through the
# host), checkpoints crossing between the GPU and CPU, and scripts/bench-gpu.sh's figures.
#   bash scripts/gpu-runs.sh BUNDLE_DIR OUT_DIR [EPOCHS]
# Every step's output goes to OUT_DIR/log; the run directories land in OUT_DIR/runs.
set -uo pipefail
bundle=$(cd "$1" && pwd)
out=$2
epochs=${3:-5}
mkdir -p "$out/runs"
# shellcheck disable=SC1091
source "$bundle/env.sh"
step() { echo; echo "=== $* ($(date +%T))"; }
job() {  # job NAME WORKERS DEVICE COMMUNICATION [extra python dict items]
  python3 - "$bundle/configs/fashion-mnist-2workers.json" "$out/$1.json" "$2" "$3" "$4" "$epochs" \
    "$bundle/data" "${5:-}" <<'PY'
import json, sys
src, dst, workers, device, comm, epochs, data, extra = sys.argv[1:]
c = json.load(open(src))
c.pop("cluster", None)
c["workers"] = int(workers)
c["gpu_sharing"] = True
t = c["train"]
t.update(device=device, communication=comm, epochs=int(epochs))
t["data"]["dir"] = data
if extra:
    t.update(json.loads(extra))
json.dump(c, open(dst, "w"), indent=1)
PY
}

step "GPU"
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv
dtrain-worker --gpu-info

step "test_gpu"
test_gpu 2>&1 | tail -4

step "test_gpu under compute-sanitizer (memcheck)"
if command -v compute-sanitizer >/dev/null; then
  # Memory errors only: NCCL's start-up probes kernel images for other GPUs and handles the
  # cudaErrorNoKernelImageForDevice it gets; those API errors are counted separately below.
  timeout 400 compute-sanitizer --tool memcheck --report-api-errors no --error-exitcode 9 \
    test_gpu >"$out/memcheck.log" 2>&1
  echo "compute-sanitizer memcheck exit: $?"
  grep -A12 -m 6 '^========= [A-Z]' "$out/memcheck.log" | head -60
  tail -3 "$out/memcheck.log"
  echo "API errors reported with --report-api-errors explicit, by call site:"
  timeout 400 compute-sanitizer --tool memcheck test_gpu 2>&1 | grep -A2 '^========= Program hit' |
    grep -o 'Program hit [a-zA-Z]*\|Host Frame: [a-zA-Z]*' | paste - - | sort | uniq -c
fi

step "one worker on the GPU, NCCL at world size 1"
job gpu1 1 cuda nccl '{"backup": {"dir": "backup", "save_freq": "epoch", "keep": 5, "delete_on_success": false}}'
time dtrain launch "$out/gpu1.json" --run-dir "$out/runs/gpu1" 2>&1 | grep -v '^\[worker' | tail -5
grep -h "device:\|communication:\|CUDA graph" "$out/runs/gpu1/logs/"*.log | head -4
cat "$out/runs/gpu1/metrics.jsonl"

step "two workers sharing the GPU, ring staged through the host"
job gpu2 2 cuda auto
time dtrain launch "$out/gpu2.json" --run-dir "$out/runs/gpu2" 2>&1 | grep -v '^\[worker' | tail -5
grep -h "device:\|communication:" "$out/runs/gpu2/logs/"*.log | head -4
cat "$out/runs/gpu2/metrics.jsonl"

step "a checkpoint from the GPU resumes on the CPU (oneDNN), one more epoch"
cp -r "$out/runs/gpu1" "$out/runs/gpu-to-cpu"
job gpu-to-cpu 1 cpu ring "{\"epochs\": $((epochs + 1))}"
dtrain launch "$out/gpu-to-cpu.json" --run-dir "$out/runs/gpu-to-cpu" 2>&1 | grep -v '^\[worker' | tail -2
grep -h "restored\|device:" "$out/runs/gpu-to-cpu/logs/"*.log | tail -3
tail -1 "$out/runs/gpu-to-cpu/metrics.jsonl"
mkdir -p "$out/gpu-checkpoint"
cp "$out/runs/gpu1/backup/checkpoint.json" "$out/gpu-checkpoint/"
cp "$(ls "$out"/runs/gpu1/backup/ckpt-*.safetensors | tail -1)" "$out/gpu-checkpoint/"

step "a checkpoint from the CPU (oneDNN, 1 epoch) resumes on the GPU for the rest"
job cpu-to-gpu 2 cpu ring '{"epochs": 1, "backup": {"dir": "backup", "save_freq": "epoch", "keep": 2, "delete_on_success": false}}'
dtrain launch "$out/cpu-to-gpu.json" --run-dir "$out/runs/cpu-to-gpu" 2>&1 | grep -v '^\[worker' | tail -2
job cpu-to-gpu 2 cuda auto
dtrain launch "$out/cpu-to-gpu.json" --run-dir "$out/runs/cpu-to-gpu" 2>&1 | grep -v '^\[worker' | tail -2
grep -h "restored\|device:" "$out/runs/cpu-to-gpu/logs/"*.log | tail -4
cat "$out/runs/cpu-to-gpu/metrics.jsonl"
rm -rf "$out"/runs/*/backup "$out"/runs/*/model

step "benchmark"
bash "$bundle/scripts/bench-gpu.sh" "$bundle" 2>&1
