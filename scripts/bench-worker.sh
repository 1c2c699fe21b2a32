#!/usr/bin/env bash
# Distributed-worker figures on the tutorial CNN (Fashion-MNIST), all in one run:
#   samples/s of one worker and of two workers (same per-worker batch 64, 200 steps), the
#   two-worker step time and the exposed all-reduce share of it (host time waiting for
#   all-reduces), each with overlap off (buckets reduced after backward: "before") and on
#   (buckets reduced while backward runs: "after"), the chief's checkpoint write time, and the time
#   from a worker's SIGKILL to the first completed step after the group restarted (back-off 0.2 s),
#   and after the group re-formed in place (docs/design.md#in-place-recovery).
#   Those two-worker runs use the TCP ring; the same run with shared memory ("communication":
#   "shm") goes beside them, and the validation time of one worker and of two (sharded). Then the
#   cost of whole steps (docs/design.md#in-place-recovery: the optimizer waits for every
#   all-reduce of the step): two workers with "recovery": "in_place" (whole steps) and "restart"
#   (bucket by bucket), ring and shm, alternated three times each, median step time. Each run's
#   input wait per step: the host's wait for the next batch from the input pipeline.
#   First, "CPU speed": one worker ("workers": 1) training the job's model on Fashion-MNIST for
#   two epochs of STEPS steps each (default 100; at most 234, an epoch of batch 256) with
#   OMP_NUM_THREADS 1 and 2, per-worker batch 64 and 256, dtype_policy float32 and
#   mixed_bfloat16 ("n/a" where the CPU or the worker cannot run bf16; a failed worker's error
#   is printed under the table): the warm samples/s (the second epoch's, from the run's
#   metrics.jsonl) beside BUILD_DIR/bench/step_bench's bare step for the same configuration,
#   worker/bare, and the share of the worker's epoch spent inside its step (metrics.jsonl's
#   step_seconds / seconds: the rest is the worker's own work between steps). Beside them the same
#   training in PyTorch at its best (bench/worker_torch.py, scripts/torch-at-best.sh): float32
#   beside dtrain's float32 and torch.autocast bf16 beside its mixed_bfloat16, the same epochs,
#   steps, batch and threads, and the worker against PyTorch float32 (the issue's aims: 2x in
#   float32, 3x in bf16).
#   --cpu-speed-repeat N alternates the six runs of a thread count and batch (bare step and
#   worker in each policy, the two PyTorch runs) N times and prints the medians (default 1); the
#   worker_vs_pytorch_fp32 column is the median of each round's own ratio.
#   scripts/bench-worker.sh [--cpu-speed-only] [--cpu-speed-steps STEPS] [--cpu-speed-repeat N] [BUILD_DIR]
# --cpu-speed-only runs that first section alone (a quick rerun).
set -euo pipefail
cd "$(dirname "$0")/.."
build=build cpu_speed_only=false cpu_speed_steps=100 cpu_speed_repeat=1
while [ $# -gt 0 ]; do
  case "$1" in
    --cpu-speed-only) cpu_speed_only=true ;;
    --cpu-speed-steps) cpu_speed_steps=$2; shift ;;
    --cpu-speed-repeat) cpu_speed_repeat=$2; shift ;;
    -*) echo "usage: scripts/bench-worker.sh [--cpu-speed-only] [--cpu-speed-steps STEPS] [--cpu-speed-repeat N] [BUILD_DIR]" >&2; exit 2 ;;
    *) build=$1 ;;
  esac
  shift
done
bash scripts/build.sh "$build" >/dev/null
. scripts/torch-at-best.sh
torch_install
torch_calibrate 50
work=$(mktemp -d /tmp/dtrain-bench-worker-XXXXXX)
trap 'rm -rf "$work"' EXIT

# CPU speed: the worker's warm samples/s beside the bare training step (step_bench).
/usr/bin/python3 - "$work" "$build" "$cpu_speed_steps" "$cpu_speed_repeat" "$torch_malloc" \
  "$torch_core" "$torch_openmp_blas" "$(torch_header)" <<'PY'
import json, os, re, subprocess, sys
work, build, steps, repeat = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
torch_malloc, torch_core, torch_blas, torch_header = sys.argv[5:9]
config = "configs/fashion-mnist-2workers.json"
base = json.load(open(config))
base.pop("cluster", None)
info = dict(line.split(" ", 1) for line in subprocess.run(
    [f"{build}/bench/step_bench", "--cpu-info"], check=True, capture_output=True,
    text=True).stdout.splitlines())

def bare_step(threads, batch, precision):
    """step_bench's samples/s, or None where it prints n/a."""
    out = subprocess.run([f"{build}/bench/step_bench", config, str(batch), str(steps), "cpu",
                          "graphs", precision], check=True, capture_output=True, text=True,
                         env=dict(os.environ, OMP_NUM_THREADS=str(threads))).stdout
    row = [l for l in out.splitlines() if l.startswith("dtrain ")][0].split()
    return None if row[3] == "n/a" else float(row[3])

def worker(threads, batch, precision):
    """One worker's second-epoch samples/s, or (None, why) when the run failed."""
    name = f"cpu-{threads}-{batch}-{precision}"
    job = json.loads(json.dumps(dict(base, job=name, workers=1)))
    job["env"] = {"OMP_NUM_THREADS": str(threads)}
    job["train"].update({"epochs": 2, "steps_per_epoch": steps, "validation": False,
                         "per_worker_batch_size": batch, "dtype_policy": precision,
                         "backup": {"dir": "backup", "save_freq": "epoch", "keep": 1,
                                    "delete_on_success": True}})
    path, run = f"{work}/{name}.json", f"{work}/{name}"
    json.dump(job, open(path, "w"))
    code = subprocess.run([f"{build}/launcher/dtrain", "launch", path, "--run-dir", run],
                          stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL).returncode
    if code != 0:
        log = open(f"{run}/logs/worker-0.log", errors="replace").read().splitlines()
        errors = [l for l in log if "error" in l.lower()] or log or [f"exit {code}"]
        return None, re.sub(r"\s+", " ", errors[-1])[:400]
    lines = [json.loads(l) for l in open(f"{run}/metrics.jsonl")]
    m = [m for m in lines if m["epoch"] == 2][0]
    return (m["samples_per_second"], m["step_seconds"] / m["seconds"]), None

def pytorch(threads, batch, precision):
    """bench/worker_torch.py's second-epoch samples/s, PyTorch at its best."""
    env = dict(os.environ, OMP_NUM_THREADS=str(threads), GLIBC_TUNABLES=torch_malloc,
               LD_LIBRARY_PATH=":".join(filter(None, [torch_blas, os.environ.get("LD_LIBRARY_PATH")])))
    if torch_core:
        env["OPENBLAS_CORETYPE"] = torch_core
    out = subprocess.run(["/usr/bin/python3", "bench/worker_torch.py", str(batch), str(steps), "2",
                          precision, "--data", base["train"]["data"]["dir"]], check=True,
                         capture_output=True, text=True, env=env).stdout
    return float([l for l in out.splitlines() if l.startswith("epoch 2 ")][0].split()[3])

print(f"# CPU speed: one worker (workers: 1), tutorial CNN, {config}'s model; worker = warm "
      f"samples/s (epoch 2 of 2, {steps} steps each, from metrics.jsonl); bare = "
      f"{build}/bench/step_bench ({steps} steps after 10 warm-up); median of {repeat} "
      "alternated runs each")
print(f"# CPU: {info.get('cpu_model')}; oneDNN ISA: {info.get('onednn_isa')}; "
      f"mixed_bfloat16: {info.get('mixed_bfloat16')}")
print("# worker_in_step: of the worker's epoch, the share spent inside its training step (the rest"
      " is its work between steps), measured in the same run, so the machine's drift between"
      " runs does not enter it")
print(f"# pytorch: bench/worker_torch.py, the same {steps}-step epochs (second epoch's samples/s), "
      "float32 in the float32 rows, torch.autocast bf16 in the mixed_bfloat16 rows; "
      "worker_vs_pytorch_fp32: the median of each round's worker / PyTorch float32")
print(torch_header)
print("threads batch precision worker_samples_per_s bare_step_samples_per_s worker_vs_bare "
      "worker_in_step pytorch_samples_per_s worker_vs_pytorch_fp32", flush=True)
notes = []
median = lambda values: sorted(values)[len(values) // 2] if values else None
policies = (("float32", "float32"), ("mixed_bfloat16", "autocast_bf16"))
for threads in (1, 2):
    for batch in (64, 256):
        runs = {p: {"bare": [], "rate": [], "share": [], "torch": [], "paired": [], "why": None}
                for p, _ in policies}
        for _ in range(repeat):
            for precision, _ in policies:
                r = runs[precision]
                if r["why"] is not None:
                    continue
                bare = bare_step(threads, batch, precision)
                measured, why = worker(threads, batch, precision) if bare else (None, None)
                if not bare or why:
                    r["why"] = why or ""
                    continue
                r["bare"].append(bare), r["rate"].append(measured[0])
                r["share"].append(measured[1])
            for precision, torch_precision in policies:
                runs[precision]["torch"].append(pytorch(threads, batch, torch_precision))
            fp32 = runs["float32"]["torch"][-1]
            for precision, _ in policies:
                r = runs[precision]
                if r["why"] is None:
                    r["paired"].append(r["rate"][-1] / fp32)
        for precision, _ in policies:
            r = runs[precision]
            bare, rate, share = median(r["bare"]), median(r["rate"]), median(r["share"])
            if r["why"]:
                notes.append(f"# {threads} {batch} {precision}: the worker failed: {r['why']}")
            paired = median(r["paired"]) if r["why"] is None else None
            cells = [f"{rate:.0f}" if rate else "n/a", f"{bare:.0f}" if bare else "n/a",
                     f"{rate / bare:.2f}" if rate and bare else "n/a",
                     f"{share:.4f}" if share else "n/a", f"{median(r['torch']):.0f}",
                     f"{paired:.2f}" if paired else "n/a"]
            print(threads, batch, precision, *cells, flush=True)
for note in notes:
    print(note)
PY
$cpu_speed_only && exit 0
echo
python3 - "$work" "$build" <<'PY'
import glob, json, os, re, signal, subprocess, sys, time
work, build = sys.argv[1], sys.argv[2]
base = json.load(open("configs/fashion-mnist-2workers.json"))
base["train"].update({"epochs": 1, "steps_per_epoch": 200, "validation": False,
                      "backup": {"dir": "backup", "save_freq": 50, "keep": 2, "delete_on_success": False}})
base["restart"] = {"max_restarts": 3, "backoff_seconds": 0.2, "grace_seconds": 10}
base.pop("cluster", None)

def launch(workers, name, kill_after_checkpoint=False, overlap=True, communication="ring",
           validation=False, env=None, recovery="restart"):
    job = json.loads(json.dumps(dict(base, job=name, workers=workers, recovery=recovery)))
    # The timing lines read below ("saved ... in N ms", "first step ...") are at debug level.
    job["env"] = dict(env or {}, DTRAIN_LOG_LEVEL="debug")
    job["train"]["overlap"] = overlap
    job["train"]["communication"] = communication
    job["train"]["validation"] = validation
    path = f"{work}/{name}.json"
    json.dump(job, open(path, "w"))
    run = f"{work}/{name}"
    p = subprocess.Popen([f"{build}/launcher/dtrain", "launch", path, "--run-dir", run],
                         stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    killed_at = None
    if kill_after_checkpoint:
        while not glob.glob(f"{run}/backup/ckpt-*"):
            time.sleep(0.01)
        pid = json.load(open(f"{run}/state.json"))["workers"][1]["pid"]
        killed_at = time.monotonic()  # CLOCK_MONOTONIC, as the workers log
        os.kill(pid, signal.SIGKILL)
    assert p.wait() == 0, f"{name} failed"
    return run, killed_at

one, _ = launch(1, "one")
# What each of two workers spent on validation before it was sharded: the whole split on one of
# the two cores (two workers get OMP_NUM_THREADS=1 each).
full, _ = launch(1, "full", validation=True, env={"OMP_NUM_THREADS": "1"})
before, _ = launch(2, "before", overlap=False)
two, _ = launch(2, "two", validation=True)
shm, _ = launch(2, "shm", communication="shm", validation=True)
m1 = json.loads(open(f"{one}/metrics.jsonl").readline())
mf = json.loads(open(f"{full}/metrics.jsonl").readline())
m0 = json.loads(open(f"{before}/metrics.jsonl").readline())
m2 = json.loads(open(f"{two}/metrics.jsonl").readline())
ms = json.loads(open(f"{shm}/metrics.jsonl").readline())
saves = [float(x) for x in re.findall(r"saved .* in (\d+) ms", open(f"{two}/logs/worker-0.log").read())]
kill, killed_at = launch(2, "kill", kill_after_checkpoint=True)
firsts = [float(x) for x in re.findall(r"first step of this run done \(CLOCK_MONOTONIC ([\d.]+)\)",
                                       open(f"{kill}/logs/worker-0.log").read())]
restart = [f for f in firsts if f > killed_at][0] - killed_at
kill_ip, killed_at_ip = launch(2, "kill-in-place", kill_after_checkpoint=True, recovery="in_place")
firsts = [float(x) for x in re.findall(r"first step of this run done \(CLOCK_MONOTONIC ([\d.]+)\)",
                                       open(f"{kill_ip}/logs/worker-0.log").read())]
in_place = [f for f in firsts if f > killed_at_ip][0] - killed_at_ip
whole = {}
for repeat in range(3):
    for communication in ("ring", "shm"):
        for recovery in ("restart", "in_place"):
            run, _ = launch(2, f"whole-{communication}-{recovery}-{repeat}",
                            communication=communication, recovery=recovery)
            m = json.loads(open(f"{run}/metrics.jsonl").readline())
            whole.setdefault((communication, recovery), []).append(m["seconds"])
print("# scripts/bench-worker.sh: tutorial CNN, batch 64 per worker, 200 steps, 2 cores")
print("metric value")
steps = base["train"]["steps_per_epoch"]
print(f"one_worker_samples_per_s {m1['samples_per_second']:.0f}")
print(f"one_worker_input_wait_ms_per_step {m1['input_wait_seconds'] / steps * 1000:.3f}")
for label, m in (("overlap_off", m0), ("overlap_on", m2), ("shm", ms)):
    print(f"two_worker_step_ms_{label} {m['seconds'] / steps * 1000:.2f}")
    print(f"exposed_allreduce_share_{label} {m['allreduce_seconds'] / m['seconds']:.3f}")
    print(f"two_worker_samples_per_s_{label} {m['samples_per_second']:.0f}")
    print(f"two_worker_input_wait_ms_per_step_{label} {m['input_wait_seconds'] / steps * 1000:.3f}")
print(f"two_worker_speedup {m2['samples_per_second'] / m1['samples_per_second']:.2f}")
print(f"validation_s_whole_split_one_core {mf['val_seconds']:.3f}")
print(f"validation_s_two_workers_sharded {m2['val_seconds']:.3f}")
print(f"validation_same_ring_and_shm {m2['val_accuracy'] == ms['val_accuracy'] and m2['val_loss'] == ms['val_loss']}")
print(f"checkpoint_write_ms_median {sorted(saves)[len(saves) // 2]:.0f} (of {len(saves)}, {os.path.getsize(sorted(glob.glob(two + '/backup/ckpt-*'))[-1]) / 1e6:.1f} MB each)")
print(f"sigkill_to_first_step_after_restart_s {restart:.2f} (back-off 0.2 s included)")
print(f"sigkill_to_first_step_in_place_s {in_place:.2f} (survivor worker 0, replacement started)")
for communication in ("ring", "shm"):
    steps_ms = {r: sorted(whole[(communication, r)])[1] / steps * 1000
                for r in ("restart", "in_place")}
    print(f"two_worker_step_ms_{communication}_bucket_by_bucket {steps_ms['restart']:.2f}")
    print(f"two_worker_step_ms_{communication}_whole_steps {steps_ms['in_place']:.2f}")
    print(f"whole_steps_cost_{communication} {steps_ms['in_place'] / steps_ms['restart'] - 1:+.1%}")
PY
