#!/usr/bin/env bash
# The ResNet job's accuracy, dtrain beside PyTorch (issue 44): runs configs/resnet-fashion-mnist.json
# (or JOB) through `dtrain launch` on its two workers, scores its final model in PyTorch with
# examples/pytorch/load_dtrain_model.py, then trains the same graph with the same data, batch,
# augmentation and hyper-parameters in PyTorch DDP (bench/resnet_torch.py: two gloo ranks of one
# thread, PyTorch at its best as scripts/torch-at-best.sh sets it up), one after the other.
#   scripts/bench-resnet.sh [--build DIR] [--epochs E] [--steps S] [--only dtrain|torch] [JOB]
# --epochs/--steps shorten both runs (the cosine decay then spans the shorter run).
# Prints the CPU, then per epoch: system epoch loss val_loss val_accuracy seconds; then each
# system's final val_accuracy and wall time, and PyTorch's score of dtrain's model.
set -euo pipefail
cd "$(dirname "$0")/.."
build=build
epochs=
steps=
only=
job=configs/resnet-fashion-mnist.json
while [ $# -gt 0 ]; do
  case "$1" in
    --build) build=$2; shift ;;
    --epochs) epochs=$2; shift ;;
    --steps) steps=$2; shift ;;
    --only) only=$2; shift ;;
    -h|--help) sed -n '2,10p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
    -*) echo "bench-resnet: unknown option $1" >&2; exit 2 ;;
    *) job=$1 ;;
  esac
  shift
done
case "$only" in ""|dtrain|torch) ;; *) echo "bench-resnet: --only dtrain or torch" >&2; exit 2 ;; esac
[ -f "$job" ] || { echo "bench-resnet: no job file $job" >&2; exit 2; }
dtrain=$build/launcher/dtrain
[ "$only" = torch ] || [ -x "$dtrain" ] ||
  { echo "bench-resnet: $dtrain not built (scripts/build.sh $build)" >&2; exit 2; }
# shellcheck source=scripts/torch-at-best.sh
source scripts/torch-at-best.sh
[ "$only" = dtrain ] || torch_install
work=$(mktemp -d /tmp/dtrain-bench-resnet.XXXXXX)
trap 'rm -rf "$work"' EXIT

python3 - "$job" "$work/job.json" "$epochs" "$steps" <<'PY'
import json, sys
source, target, epochs, steps = sys.argv[1:]
job = json.load(open(source))
job["job"] = "bench-resnet"
job.pop("cluster", None)
job["workers"] = 2  # free ports picked by the launcher
if epochs:
    job["train"]["epochs"] = int(epochs)
if steps:
    job["train"]["steps_per_epoch"] = int(steps)
json.dump(job, open(target, "w"))
PY

echo "# CPU: $(sed -n 's/^model name[[:space:]]*: //p' /proc/cpuinfo | head -n 1), $(nproc) cores;" \
  "$(date -u +%Y-%m-%d); job $job${epochs:+, $epochs epochs}${steps:+, $steps steps an epoch}"
printf '%-7s %5s %8s %8s %12s %8s\n' system epoch loss val_loss val_accuracy seconds

seconds_since() { python3 -c "import sys,time; print('%.0f' % (time.time() - float(sys.argv[1])))" "$1"; }

if [ "$only" != torch ]; then
  started=$(date +%s.%N)
  if ! "$dtrain" launch "$work/job.json" --run-dir "$work/run" >"$work/dtrain.out" 2>&1; then
    tail -n 20 "$work/dtrain.out" >&2
    echo "bench-resnet: dtrain's run failed" >&2
    exit 1
  fi
  dtrain_seconds=$(seconds_since "$started")
  python3 - "$work/run/metrics.jsonl" <<'PY'
import json, sys
for line in open(sys.argv[1]):
    m = json.loads(line)
    print("%-7s %5d %8.4f %8.4f %12.4f %8.1f" % ("dtrain", m["epoch"], m["loss"], m["val_loss"],
                                                m["val_accuracy"], m["seconds"] + m.get("val_seconds", 0)))
PY
  dtrain_final=$(tail -n 1 "$work/run/metrics.jsonl" | python3 -c "import json,sys; print(json.load(sys.stdin)['val_accuracy'])")
  torch_score=$(torch_python examples/pytorch/load_dtrain_model.py "$work/run" --json)
fi
if [ "$only" != dtrain ]; then
  started=$(date +%s.%N)
  if ! torch_python bench/resnet_torch.py "$work/job.json" >"$work/torch.out" 2>"$work/torch.err"; then
    tail -n 20 "$work/torch.err" >&2
    echo "bench-resnet: PyTorch's run failed" >&2
    exit 1
  fi
  torch_seconds=$(seconds_since "$started")
  python3 - "$work/torch.out" <<'PY'
import json, sys
for line in open(sys.argv[1]):
    m = json.loads(line)
    print("%-7s %5d %8.4f %8.4f %12.4f %8.1f" % ("torch", m["epoch"], m["loss"], m["val_loss"],
                                                m["val_accuracy"], m["seconds"]))
PY
  torch_final=$(tail -n 1 "$work/torch.out" | python3 -c "import json,sys; print(json.load(sys.stdin)['val_accuracy'])")
fi
[ "$only" = torch ] || echo "# dtrain: final val_accuracy $dtrain_final in $dtrain_seconds s;" \
  "its model in PyTorch: $torch_score"
[ "$only" = dtrain ] || echo "# PyTorch DDP: final val_accuracy $torch_final in $torch_seconds s"
