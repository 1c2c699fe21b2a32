#!/usr/bin/env python3
"""How long a fault takes to be found and recovered from, on a quiet and on a busy machine, for
one or more builds side by side (docs/design.md#frozen-workers): a two-worker group of the main
job's model and data (recovery in place, default settings) is launched, and once worker 1 has
finished step 50 it is SIGSTOPped and never continued ("stop"), SIGKILLed ("kill"), or it spins on
the CPU for ever before step 60 ("spin": DTRAIN_TEST_SPIN_AT_STEP, a build that has the hook).
Found: from the fault to the launcher's `frozen` event (its `exit` for a kill); recovered: to its
`recovered` event, the group's first step after the replacement joined. Busy: B competing
CPU-bound processes spin throughout. All on CLOCK_MONOTONIC (events.jsonl's `mono`).

  freeze_detection.py --build NAME=DTRAIN [--build ...] [--runs R] [--busy B] [--faults stop,kill,spin]
"""
import argparse
import json
import os
import shutil
import signal
import statistics
import struct
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)


def record_step(run, worker):
    """Global step in the worker's progress record (common/progress_record.h), -1 without one."""
    try:
        with open(os.path.join(run, "progress", f"worker-{worker}"), "rb") as f:
            data = f.read(64)
    except OSError:
        return -1
    if len(data) < 64 or struct.unpack_from("<I", data, 0)[0] != 0x52505444:
        return -1
    return struct.unpack_from("<Q", data, 32)[0]


def events(run):
    try:
        with open(os.path.join(run, "events.jsonl")) as f:
            return [json.loads(line) for line in f if line.strip()]
    except OSError:
        return []


def state_pids(run):
    with open(os.path.join(run, "state.json")) as f:
        return {w["task"]: w["pid"] for w in json.load(f)["workers"]}


def job_file(work, fault):
    with open(os.path.join(ROOT, "configs", "fashion-mnist-2workers.json")) as f:
        job = json.load(f)
    job["job"] = "freeze-bench"
    job.pop("cluster", None)
    job["workers"] = 2
    job["restart"] = {"max_restarts": 10, "backoff_seconds": 0.2, "grace_seconds": 5}
    job["train"]["epochs"] = 1
    job["train"]["steps_per_epoch"] = 400
    job["train"]["validation"] = False
    job["train"]["tensorboard"] = False
    job["train"]["backup"] = {"dir": "backup", "save_freq": "epoch", "keep": 1,
                              "delete_on_success": True}
    if fault == "spin":
        job.setdefault("env", {})["DTRAIN_TEST_SPIN_AT_STEP"] = "1:60"
    path = os.path.join(work, f"job-{fault}.json")
    with open(path, "w") as f:
        json.dump(job, f)
    return path


def wait_until(predicate, seconds):
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(0.002)
    return None


def one_run(dtrain, work, fault, rep):
    run = os.path.join(work, f"run-{fault}-{rep}")
    shutil.rmtree(run, ignore_errors=True)
    launcher = subprocess.Popen([dtrain, "launch", job_file(work, fault), "--run-dir", run],
                                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        if fault == "spin":  # it spins once step 59 is done
            if not wait_until(lambda: record_step(run, 1) >= 59, 180):
                return None
            t0 = time.monotonic()
        else:
            if not wait_until(lambda: record_step(run, 1) >= 50, 180):
                return None
            pid = state_pids(run)["worker:1"]
            t0 = time.monotonic()
            os.kill(pid, signal.SIGSTOP if fault == "stop" else signal.SIGKILL)

        def found():
            for e in events(run):
                if e["event"] == "frozen" or (fault == "kill" and e["event"] == "exit"
                                              and e.get("task") == "worker:1"):
                    return e["mono"]
            return None

        def recovered():
            for e in events(run):
                if e["event"] == "recovered":
                    return e["mono"]
            return None

        seen = wait_until(found, 120)
        back = wait_until(recovered, 120)
        return (seen - t0 if seen else None, back - t0 if back else None)
    finally:
        launcher.send_signal(signal.SIGTERM)
        try:
            launcher.wait(60)
        except subprocess.TimeoutExpired:
            launcher.kill()
            launcher.wait()


def spinners(n):
    return [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(n)]


def fmt(values):
    values = [v for v in values if v is not None]
    if not values:
        return "n/a"
    return f"{statistics.median(values):.2f} ({min(values):.2f}-{max(values):.2f})"


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--build", action="append", required=True, help="NAME=path/to/dtrain")
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--busy", type=int, default=2)
    parser.add_argument("--faults", default="stop,kill,spin")
    parser.add_argument("--no-spin-for", default="", help="builds without the spin hook (comma)")
    args = parser.parse_args()
    builds = [b.split("=", 1) for b in args.build]
    no_spin = set(filter(None, args.no_spin_for.split(",")))
    work = tempfile.mkdtemp(prefix="dtrain-freeze-bench-")
    results = {}
    for load in ("quiet", "busy"):
        hogs = spinners(args.busy) if load == "busy" else []
        try:
            for rep in range(args.runs):
                for fault in args.faults.split(","):
                    for name, dtrain in builds:  # builds alternate within each repetition
                        if fault == "spin" and name in no_spin:
                            continue
                        r = one_run(dtrain, work, fault, f"{name}-{load}-{rep}")
                        results.setdefault((fault, load, name), []).append(r or (None, None))
                        print(f"# {fault} {load} {name} run {rep}: {r}", file=sys.stderr,
                              flush=True)
        finally:
            for h in hogs:
                h.kill()
                h.wait()
    print("fault load build runs found_s_median(min-max) recovered_s_median(min-max)")
    for (fault, load, name), rs in results.items():
        print(f"{fault} {load} {name} {len(rs)} {fmt([r[0] for r in rs]).replace(' ', '')} "
              f"{fmt([r[1] for r in rs]).replace(' ', '')}")
    shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
