#!/usr/bin/env bash
# The character GPT, dtrain beside PyTorch (issue 45): runs configs/char-gpt-shakespeare.json (or
# JOB) through `dtrain launch` on its two workers and the same model, data, batch, schedule and
# steps in PyTorch DDP (bench/gpt_torch.py: two gloo ranks of one thread, PyTorch at its best as
# scripts/torch-at-best.sh sets it up), for seeds 1337, 1338 and 1339, alternating.
#   scripts/bench-gpt.sh [--build DIR] [--steps N] [--seeds "S1 S2 ..."] [JOB]
# --steps N (default 2000) scales the run: 8 epochs of N/8 steps (1 epoch when 8 does not divide
# N), the warm-up and the decay by N/2000. Prints the CPU, a row a seed: its val_loss after the
# last epoch, wall seconds (the whole command) and training tokens/s (global batch x T x steps over
# the epochs' training seconds, validation left out) of each; then the means and their difference.
set -euo pipefail
cd "$(dirname "$0")/.."
build=build
steps=2000
seeds="1337 1338 1339"
job=configs/char-gpt-shakespeare.json
while [ $# -gt 0 ]; do
  case "$1" in
    --build) build=$2; shift ;;
    --steps) steps=$2; shift ;;
    --seeds) seeds=$2; shift ;;
    -h|--help) sed -n '2,10p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
    -*) echo "bench-gpt: unknown option $1" >&2; exit 2 ;;
    *) job=$1 ;;
  esac
  shift
done
[ -f "$job" ] || { echo "bench-gpt: no job file $job" >&2; exit 2; }
dtrain=$build/launcher/dtrain
[ -x "$dtrain" ] || { echo "bench-gpt: $dtrain not built (scripts/build.sh $build)" >&2; exit 2; }
# shellcheck source=scripts/torch-at-best.sh
source scripts/torch-at-best.sh
torch_install
work=$(mktemp -d /tmp/dtrain-bench-gpt.XXXXXX)
trap 'rm -rf "$work"' EXIT

# A copy of the job per seed, scaled to N steps; the data path made absolute.
for seed in $seeds; do
  /usr/bin/python3 - "$job" "$work/job-$seed.json" "$steps" "$seed" <<'PY'
import json, os, sys
source, target, steps, seed = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
job = json.load(open(source))
job["job"] = "bench-gpt"
job.pop("cluster", None)
job["workers"] = 2  # free ports picked by the launcher
train = job["train"]
train["seed"] = seed
train.pop("backup", None)
train["data"]["path"] = os.path.abspath(train["data"]["path"])
total = train["epochs"] * train["steps_per_epoch"]
if steps != total:
    train["epochs"] = 8 if steps % 8 == 0 else 1
    train["steps_per_epoch"] = steps // train["epochs"]
    schedule = train["optimizer"]["learning_rate"]
    if isinstance(schedule, dict):
        warmup = round(schedule.get("warmup_steps", 0) * steps / total)
        schedule["warmup_steps"] = warmup
        schedule["decay_steps"] = max(round(schedule["decay_steps"] * steps / total), 1)
json.dump(job, open(target, "w"))
PY
done

echo "# CPU: $(sed -n 's/^model name[[:space:]]*: //p' /proc/cpuinfo | head -n 1), $(nproc) cores;" \
  "$(date -u +%Y-%m-%d); job $job, $steps steps; PyTorch $(/usr/bin/python3 -c 'import torch; print(torch.__version__)') DDP, 2 gloo ranks of 1 thread"
torch_calibrate 30
torch_header
printf '%-5s %13s %13s %9s %9s %10s %10s\n' seed dtrain_val torch_val dtrain_s torch_s \
  dtrain_tok/s torch_tok/s

seconds_since() { /usr/bin/python3 -c "import sys,time; print('%.0f' % (time.time() - float(sys.argv[1])))" "$1"; }

# last_val FILE: the val_loss of a file of JSON lines' last line; tokens_per_s JOB FILE: training
# tokens over the lines' training seconds.
last_val() { tail -n 1 "$1" | /usr/bin/python3 -c "import json,sys; print('%.4f' % json.load(sys.stdin)['val_loss'])"; }
tokens_per_s() {
  /usr/bin/python3 - "$1" "$2" <<'PY'
import json, sys
train = json.load(open(sys.argv[1]))["train"]
lines = [json.loads(l) for l in open(sys.argv[2]) if l.strip()]
tokens = (train["epochs"] * train["steps_per_epoch"] * 2 * train["per_worker_batch_size"] *
          train["model"]["input_shape"][0])
print("%.0f" % (tokens / sum(m["seconds"] for m in lines)))
PY
}

rows=()
for seed in $seeds; do
  started=$(date +%s.%N)
  if ! "$dtrain" launch "$work/job-$seed.json" --run-dir "$work/run-$seed" >"$work/dtrain.out" 2>&1; then
    tail -n 20 "$work/dtrain.out" >&2
    echo "bench-gpt: dtrain's run failed (seed $seed)" >&2
    exit 1
  fi
  dtrain_s=$(seconds_since "$started")
  started=$(date +%s.%N)
  if ! torch_python bench/gpt_torch.py "$work/job-$seed.json" >"$work/torch-$seed.out" 2>"$work/torch.err"; then
    tail -n 20 "$work/torch.err" >&2
    echo "bench-gpt: PyTorch's run failed (seed $seed)" >&2
    exit 1
  fi
  torch_s=$(seconds_since "$started")
  row="$seed $(last_val "$work/run-$seed/metrics.jsonl") $(last_val "$work/torch-$seed.out") $dtrain_s $torch_s"
  row+=" $(tokens_per_s "$work/job-$seed.json" "$work/run-$seed/metrics.jsonl")"
  row+=" $(tokens_per_s "$work/job-$seed.json" "$work/torch-$seed.out")"
  rows+=("$row")
  # shellcheck disable=SC2086
  printf '%-5s %13s %13s %9s %9s %10s %10s\n' $row
done
printf '%s\n' "${rows[@]}" | awk '
  { for (i = 2; i <= 7; i++) sum[i] += $i; n++ }
  END {
    printf "%-5s %13.4f %13.4f %9.0f %9.0f %10.0f %10.0f\n", "mean", sum[2] / n, sum[3] / n,
      sum[4] / n, sum[5] / n, sum[6] / n, sum[7] / n
    printf "# difference of the means, dtrain - PyTorch: val_loss %+.4f\n", (sum[2] - sum[3]) / n
  }'
