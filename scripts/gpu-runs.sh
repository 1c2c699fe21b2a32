#!/usr/bin/env bash
# The GPU runs, on a machine with an NVIDIA GPU, from the folder scripts/bundle.sh made:
#   gpu       the GPU and the build's view of it
#   test      test_gpu (the CUDA backend against the reference, every math mode, NCCL, training)
#   memcheck  test_gpu under compute-sanitizer, in the background while the jobs run
#   bench     scripts/bench-gpu.sh's figures (alone on the GPU: memcheck has finished)
#   jobs      the Fashion-MNIST job with one worker at each precision (float32, tf32,
#             mixed_bfloat16, mixed_float16)
#   inplace   two workers sharing the GPU over the host-staged ring, undisturbed and with one
#             SIGKILLed in epoch 2: the survivor kept, and the two final models compared
#   crossing  a GPU checkpoint resumed on the CPU and a CPU one on the GPU
#   bash scripts/gpu-runs.sh BUNDLE_DIR OUT_DIR [EPOCHS]
# SECTIONS (default "gpu test memcheck bench jobs inplace") picks sections; GPU_RUNS_DEVICE=cpu
# runs the jobs and inplace sections on the CPU instead, to try the script without a GPU. Every step's output
# goes to stdout; run directories land in OUT_DIR/runs.
set -uo pipefail
bundle=$(cd "$1" && pwd)
out=$2
epochs=${3:-5}
sections=" ${SECTIONS:-gpu test memcheck bench jobs inplace} "
device=${GPU_RUNS_DEVICE:-cuda}
mkdir -p "$out/runs"
# shellcheck disable=SC1091
source "$bundle/env.sh"
want() { [[ $sections == *" $1 "* ]]; }
step() { echo; echo "=== $* ($(date +%T))"; }
job() {  # job NAME WORKERS DEVICE COMMUNICATION [extra train items as JSON]
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
launch() {  # launch NAME: runs the job file NAME.json into runs/NAME
  dtrain launch "$out/$1.json" --run-dir "$out/runs/$1" 2>&1 | grep -v '^\[worker' | tail -3
}
summary() {  # summary NAME: the device lines and the last epoch's metrics
  grep -h "device:\|communication:\|CUDA graph\|algorithm" "$out/runs/$1/logs/"*.log | sort -u | head -4
  tail -1 "$out/runs/$1/metrics.jsonl"
}

if want gpu; then
  step "GPU"
  nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv
  dtrain-worker --gpu-info
fi

if want test; then
  step "test_gpu"
  timeout 300 test_gpu 2>&1 | tail -40
fi

memcheck_pid=""
if want memcheck && command -v compute-sanitizer >/dev/null; then
  step "test_gpu under compute-sanitizer (memcheck), in the background"
  # Memory errors only: NCCL's start-up probes kernel images for other GPUs and handles the
  # cudaErrorNoKernelImageForDevice it gets.
  (timeout "${MEMCHECK_SECONDS:-400}" compute-sanitizer --tool memcheck --report-api-errors no --error-exitcode 9 \
    test_gpu >"$out/memcheck.log" 2>&1; echo "compute-sanitizer memcheck exit: $?" >>"$out/memcheck.log") &
  memcheck_pid=$!
fi

if want jobs; then
  for precision in float32 tf32 mixed_bfloat16 mixed_float16; do
    step "one worker on the GPU, $precision"
    extra="{\"dtype_policy\": \"$precision\"}"
    [ "$precision" = tf32 ] && extra='{"allow_tf32": true}'
    job "gpu1-$precision" 1 "$device" auto "$extra"
    launch "gpu1-$precision"
    summary "gpu1-$precision"
    head -c 300 "$out/runs/gpu1-$precision/model/model.json"; echo
  done
fi

if want inplace; then
  step "two workers sharing the GPU (ring staged through the host), undisturbed"
  job gpu2-calm 2 "$device" auto '{"epochs": 3}'
  launch gpu2-calm
  summary gpu2-calm
  step "two workers sharing the GPU, undisturbed again (the same model expected)"
  job gpu2-calm2 2 "$device" auto '{"epochs": 3}'
  launch gpu2-calm2
  sha256sum "$out/runs/gpu2-calm/model/model.safetensors" "$out/runs/gpu2-calm2/model/model.safetensors"
  step "the same, worker:1 SIGKILLed in epoch 2: recovery in place"
  job gpu2-kill 2 "$device" auto '{"epochs": 3}'
  dtrain launch "$out/gpu2-kill.json" --run-dir "$out/runs/gpu2-kill" >"$out/gpu2-kill.out" 2>&1 &
  launcher=$!
  for _ in $(seq 600); do  # up to 60 s for epoch 1 to end
    [ -s "$out/runs/gpu2-kill/metrics.jsonl" ] && break
    sleep 0.1
  done
  sleep 1
  victim=$(python3 - "$out/runs/gpu2-kill" <<'PY'
import os, sys
run = sys.argv[1].encode()
for pid in os.listdir("/proc"):
    try:
        if not pid.isdigit() or open(f"/proc/{pid}/comm").read().strip() != "dtrain-worker":
            continue
        env = open(f"/proc/{pid}/environ", "rb").read()
        if run in env and b'"index": 1' in env.replace(b'"index":1', b'"index": 1'):
            print(pid)
    except OSError:
        pass
PY
)
  echo "SIGKILL to worker:1, pid ${victim:-none} ($(date +%T.%N | cut -c1-12))"
  [ -n "$victim" ] && kill -9 "$victim"
  wait "$launcher"
  echo "launch exit: $?"
  grep -v '^\[worker' "$out/gpu2-kill.out" | tail -4
  summary gpu2-kill
  grep -h "re-formed as generation\|the group broke" "$out/runs/gpu2-kill/logs/"worker-0*.log | head -3
  grep -o '"event":"in_place"[^}]*' "$out/runs/gpu2-kill/events.jsonl" | head -2
  sha256sum "$out/runs/gpu2-calm/model/model.safetensors" "$out/runs/gpu2-kill/model/model.safetensors"
  if cmp -s "$out/runs/gpu2-calm/model/model.safetensors" "$out/runs/gpu2-kill/model/model.safetensors"; then
    echo "in place on the GPU: the same final model, bit for bit"
  else
    echo "in place on the GPU: the final models DIFFER"
  fi
fi

if want crossing; then
  step "a checkpoint from the GPU resumes on the CPU (oneDNN), one more epoch"
  job gpu1 1 cuda nccl '{"backup": {"dir": "backup", "save_freq": "epoch", "keep": 5, "delete_on_success": false}}'
  launch gpu1
  cp -r "$out/runs/gpu1" "$out/runs/gpu-to-cpu"
  job gpu-to-cpu 1 cpu ring "{\"epochs\": $((epochs + 1))}"
  launch gpu-to-cpu
  grep -h "restored\|device:" "$out/runs/gpu-to-cpu/logs/"*.log | tail -3
  tail -1 "$out/runs/gpu-to-cpu/metrics.jsonl"
  step "a checkpoint from the CPU (oneDNN, 1 epoch) resumes on the GPU for the rest"
  job cpu-to-gpu 2 cpu ring '{"epochs": 1, "backup": {"dir": "backup", "save_freq": "epoch", "keep": 2, "delete_on_success": false}}'
  launch cpu-to-gpu
  job cpu-to-gpu 2 cuda auto
  launch cpu-to-gpu
  grep -h "restored\|device:" "$out/runs/cpu-to-gpu/logs/"*.log | tail -4
  cat "$out/runs/cpu-to-gpu/metrics.jsonl"
fi

if [ -n "$memcheck_pid" ]; then
  step "compute-sanitizer memcheck"
  wait "$memcheck_pid"
  grep -A12 -m 6 '^========= [A-Z]' "$out/memcheck.log" | head -40
  tail -4 "$out/memcheck.log"
fi

if want bench; then
  step "benchmark"
  bash "$bundle/scripts/bench-gpu.sh" "$bundle" 2>&1
fi
rm -rf "$out"/runs/*/backup
