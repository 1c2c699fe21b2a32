#!/usr/bin/env bash
# The main job's accuracy over seeds: runs configs/fashion-mnist-2workers.json through
# `dtrain launch` once per seed (only train.seed changed), and with --baseline also the same job
# with the optimizer it had before issue 15 (SGD, constant 0.01, momentum 0.9), side by side.
# --policy P trains under train.dtype_policy P (Keras's names: mixed_bfloat16, ...).
#   scripts/bench-accuracy.sh [--baseline] [--policy P] [--build DIR] [SEED...]  (seeds: 42 1 2)
# Prints one row per run: variant seed val_accuracy per epoch, final val_accuracy, seconds.
set -euo pipefail
cd "$(dirname "$0")/.."
build=build
baseline=0
policy=float32
seeds=()
while [ $# -gt 0 ]; do
  case "$1" in
    --baseline) baseline=1 ;;
    --build) build=$2; shift ;;
    --policy) policy=$2; shift ;;
    -h|--help) sed -n '2,7p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
    *) seeds+=("$1") ;;
  esac
  shift
done
[ ${#seeds[@]} -gt 0 ] || seeds=(42 1 2)
dtrain=$build/launcher/dtrain
[ -x "$dtrain" ] || { echo "bench-accuracy: $dtrain not built (scripts/build.sh $build)" >&2; exit 2; }
work=$(mktemp -d /tmp/dtrain-accuracy.XXXXXX)
trap 'rm -rf "$work"' EXIT

# variant name -> optimizer JSON ("" keeps the config's own)
variants=("main-job|")
[ "$policy" = float32 ] || variants=("$policy|")
[ $baseline -eq 1 ] &&
  variants+=('constant-0.01|{"type": "sgd", "learning_rate": 0.01, "momentum": 0.9}')

printf '%-14s %5s %-41s %8s %8s\n' variant seed "val_accuracy per epoch" final seconds
for v in "${variants[@]}"; do
  name=${v%%|*}
  optimizer=${v#*|}
  for seed in "${seeds[@]}"; do
    job=$work/$name-$seed.json
    python3 - configs/fashion-mnist-2workers.json "$job" "$seed" "$optimizer" "$policy" <<'PY'
import json, sys
source, target, seed, optimizer, policy = sys.argv[1], sys.argv[2], int(sys.argv[3]), sys.argv[4], sys.argv[5]
job = json.load(open(source))
job["job"] = "accuracy"
job.pop("cluster", None)
job["workers"] = 2  # free ports picked by the launcher
job["train"]["seed"] = seed
if optimizer:
    job["train"]["optimizer"] = json.loads(optimizer)
job["train"]["dtype_policy"] = policy
json.dump(job, open(target, "w"))
PY
    started=$(date +%s.%N)
    if ! "$dtrain" launch "$job" --run-dir "$work/run-$name-$seed" >"$work/$name-$seed.out" 2>&1; then
      tail -n 20 "$work/$name-$seed.out" >&2
      echo "bench-accuracy: $name seed $seed failed" >&2
      exit 1
    fi
    seconds=$(python3 -c "import sys,time; print('%.0f' % (time.time() - float(sys.argv[1])))" "$started")
    python3 - "$work/run-$name-$seed/metrics.jsonl" "$name" "$seed" "$seconds" <<'PY'
import json, sys
path, name, seed, seconds = sys.argv[1:]
accuracies = [json.loads(line)["val_accuracy"] for line in open(path)]
print("%-14s %5s %-41s %8.4f %8s" % (name, seed, " ".join("%.4f" % a for a in accuracies),
                                     accuracies[-1], seconds))
PY
  done
done
