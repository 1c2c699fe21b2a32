#!/usr/bin/env bash
# Where a worker's CPU time goes, thread by thread, in the main job's steady state: two workers
# on this host (OMP_NUM_THREADS=1 each: the launcher divides the cores), fp32 and, where the CPU
# has bf16 products, mixed_bfloat16. Samples /proc/PID/task/*/stat of each worker after 60 steps
# and again 8 s later, and prints each thread's share of one core: the step (the main thread and
# any OpenMP threads), dt-comm (the all-reduce thread), dt-batches (the input pipeline),
# dt-accept and dt-signals; and the share each spent runnable but waiting for a core (schedstat:
# the others, or anything else on the machine, taking it). The step should hold its core: the
# others should be near zero. Run it on a quiet machine: other load shows as waiting.
#   scripts/bench-threads.sh [BUILD_DIR]
set -euo pipefail
cd "$(dirname "$0")/.."
build=${1:-build}
bash scripts/build.sh "$build" >/dev/null
work=$(mktemp -d /tmp/dtrain-bench-threads-XXXXXX)
trap 'rm -rf "$work"' EXIT
/usr/bin/python3 - "$work" "$build" <<'PY'
import json, os, signal, subprocess, sys, time
work, build = sys.argv[1], sys.argv[2]
tick = os.sysconf("SC_CLK_TCK")

def threads(pid):
    out = {}
    for tid in os.listdir(f"/proc/{pid}/task"):
        try:
            name = open(f"/proc/{pid}/task/{tid}/comm").read().strip()
            fields = open(f"/proc/{pid}/task/{tid}/stat").read().rsplit(")", 1)[1].split()
            waited = int(open(f"/proc/{pid}/task/{tid}/schedstat").read().split()[1]) / 1e9
        except OSError:
            continue
        kind = "step (main)" if int(tid) == pid else ("step (OpenMP)" if name == "dtrain-worker" else name)
        out[int(tid)] = (kind, (int(fields[11]) + int(fields[12])) / tick, waited)
    return out

def run(policy):
    job = json.load(open("configs/fashion-mnist-2workers.json"))
    job.pop("cluster", None)
    job["job"] = f"threads-{policy}"
    job["workers"] = 2
    job["train"].update({"epochs": 1, "steps_per_epoch": 5000, "validation": False,
                         "dtype_policy": policy})
    job["train"]["backup"]["save_freq"] = 1000
    path = f"{work}/{policy}.json"
    json.dump(job, open(path, "w"))
    rundir = f"{work}/{policy}"
    p = subprocess.Popen([f"{build}/launcher/dtrain", "launch", path, "--run-dir", rundir],
                         stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    pids, deadline = [], time.monotonic() + 120
    while time.monotonic() < deadline:  # both workers past step 60
        time.sleep(0.2)
        try:
            workers = json.load(open(f"{rundir}/state.json"))["workers"]
        except (OSError, ValueError, KeyError):
            continue
        steps = [(w.get("last_progress") or {}).get("global_step", 0) for w in workers]
        if len(workers) == 2 and min(steps) >= 60:
            pids = [w["pid"] for w in workers]
            break
    assert pids, f"{policy}: the workers did not reach step 60 in 120 s"
    before = {pid: threads(pid) for pid in pids}
    t0 = time.monotonic()
    time.sleep(8)
    after = {pid: threads(pid) for pid in pids}
    elapsed = time.monotonic() - t0
    p.send_signal(signal.SIGTERM)  # enough measured: the launcher stops the job
    p.wait(timeout=120)
    shares, waits = {}, {}
    for i, pid in enumerate(pids):
        for tid, (kind, cpu, waited) in after[pid].items():
            _, cpu0, waited0 = before[pid].get(tid, (kind, 0.0, 0.0))
            shares.setdefault(kind, [0.0] * len(pids))[i] += (cpu - cpu0) / elapsed
            waits.setdefault(kind, [0.0] * len(pids))[i] += (waited - waited0) / elapsed
    for kind in sorted(shares):
        print(f"{policy:15s} {kind:15s} " + " ".join(f"{v:8.1%}" for v in shares[kind]) + "  " +
              " ".join(f"{v:8.1%}" for v in waits[kind]))

model = open("/proc/cpuinfo").read().split("model name")[1].split("\n")[0].strip(": \t")
print(f"# scripts/bench-threads.sh: {model}, {os.cpu_count()} cores; share of one core per thread, "
      "summed over each worker's threads of that kind, 8 s of steady training")
print("policy          thread          on a core (worker:0 worker:1)  waiting for one (worker:0 worker:1)")
run("float32")
flags = open("/proc/cpuinfo").read()
if "avx512_bf16" in flags or "amx_bf16" in flags:
    run("mixed_bfloat16")
else:
    print("mixed_bfloat16  n/a (no bf16 products on this CPU)")
PY
