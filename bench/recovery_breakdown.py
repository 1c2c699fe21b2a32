#!/usr/bin/env python3
"""Where recovery time goes: a two-worker group of the main job's model and data (120 steps, a
step checkpoint every 50, back-off 0.2 s) is launched, worker 1 is SIGKILLed after the first
checkpoint, and the time from the SIGKILL to the group's first completed step after the restart
is split into phases from events.jsonl (the launcher's side) and the workers' "start-up:" log
lines (worker/train/timeline.h). All on CLOCK_MONOTONIC. Two configurations side by side: without
the decompressed-IDX cache (DTRAIN_CACHE_DIR=off, as before it existed) and with it (warmed by
the first start). Run by scripts/bench-recovery.sh; prints "phase no_cache_s cache_s" rows
(means over the runs). Asserts nothing."""
import json
import os
import re
import signal
import subprocess
import sys
import tempfile
import time

JOB = {
    "job": "recovery", "workers": 2,
    "restart": {"max_restarts": 3, "backoff_seconds": 0.2, "grace_seconds": 10},
    "train": {
        "model": {"input_shape": [28, 28, 1], "layers": [
            {"type": "conv2d", "filters": 32, "kernel_size": 3, "activation": "relu"},
            {"type": "flatten"}, {"type": "dense", "units": 128, "activation": "relu"},
            {"type": "dense", "units": 10}]},
        "loss": {"type": "sparse_categorical_crossentropy", "from_logits": True},
        "optimizer": {"type": "sgd", "learning_rate": 0.01, "momentum": 0.9},
        "data": {"source": "idx", "dir": "/usr/share/datasets/fashion-mnist"},
        "per_worker_batch_size": 64, "epochs": 1, "steps_per_epoch": 120, "validation": False,
        "seed": 42,
        "backup": {"dir": "backup", "save_freq": 50, "keep": 2, "delete_on_success": False}}}

STARTUP = re.compile(r"start-up: main at CLOCK_MONOTONIC ([\d.]+)((?:; [^;+]+ \+[\d.]+ s)*)")
PHASE = re.compile(r"; ([^;+]+) \+([\d.]+) s")


def events(run):
    with open(os.path.join(run, "events.jsonl")) as f:
        return [json.loads(line) for line in f if line.strip()]


def startups(log_path):
    """Per attempt, in order: (main time, [(phase, seconds), ...])."""
    with open(log_path, errors="replace") as f:
        text = f.read()
    return [(float(m.group(1)), PHASE.findall(m.group(2))) for m in STARTUP.finditer(text)]


def one_run(dtrain, work, rep, env):
    run = os.path.join(work, f"run-{rep}-{env['DTRAIN_CACHE_DIR'] != 'off'}")
    job = os.path.join(work, "job.json")
    with open(job, "w") as f:
        json.dump(JOB, f)
    launcher = subprocess.Popen([dtrain, "launch", job, "--run-dir", run], env=env,
                                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.monotonic() + 120
    while not os.path.exists(os.path.join(run, "backup", "checkpoint.json")):
        if time.monotonic() > deadline:
            launcher.kill()
            return None
        time.sleep(0.005)
    with open(os.path.join(run, "state.json")) as f:
        victim = json.load(f)["workers"][1]["pid"]
    killed = time.monotonic()
    os.kill(victim, signal.SIGKILL)
    launcher.wait(timeout=300)
    ev = events(run)
    exits = [e for e in ev if e["event"] == "exit" and e["attempt"] == 0]
    noticed = next(e["mono"] for e in exits if e["task"] == "worker:1")
    stopped = max(e["mono"] for e in exits)
    spawns = {e["task"]: e["mono"] for e in ev if e["event"] == "spawn" and e["attempt"] == 1}
    # The critical path: the worker whose first step after the restart ended last.
    best = None
    for i in range(2):
        runs = startups(os.path.join(run, "logs", f"worker-{i}.log"))
        if len(runs) < 2:
            return None
        main, phases = runs[1]
        end = main + sum(float(s) for _, s in phases)
        if best is None or end > best[0]:
            best = (end, main, phases, spawns[f"worker:{i}"])
    end, main, phases, spawned = best
    rows = [("notice", noticed - killed),
            ("stop_group", stopped - noticed),
            ("backoff", min(spawns.values()) - stopped),
            ("spawn_to_main", main - min(spawns.values()))]
    rows += [(name.replace(" ", "_"), float(s)) for name, s in phases]
    rows.append(("total", end - killed))
    rows.append(("total_without_backoff", end - killed - rows[2][1]))
    return rows


LEGEND = """# notice: SIGKILL to the launcher seeing the exit; stop_group: SIGTERM to the other worker
# and its exit; backoff: back-off and port checks until the first spawn; spawn_to_main: exec and
# dynamic loading; backend, data (read and decode the IDX files), rendezvous (the TCP ring),
# model (layers, optimizer, buffers), checkpoint_read (the chief reads and verifies the newest
# checkpoint), broadcast (its state to the others), first_step: as the worker's timeline logs
# them; total: SIGKILL to the first completed step after the restart."""


def mean_rows(dtrain, work, reps, env):
    results = [r for r in (one_run(dtrain, work, rep, env) for rep in range(reps)) if r]
    if not results:
        return None, 0
    return [(name, sum(r[i][1] for r in results) / len(results))
            for i, (name, _) in enumerate(results[0])], len(results)


def main():
    dtrain = sys.argv[1]
    reps = int(sys.argv[2]) if len(sys.argv) > 2 else 5
    with tempfile.TemporaryDirectory(prefix="dtrain-bench-recovery-") as work:
        # The workers' "start-up:" timing line is at debug level.
        off = dict(os.environ, DTRAIN_CACHE_DIR="off", DTRAIN_LOG_LEVEL="debug")
        on = dict(os.environ, DTRAIN_CACHE_DIR=os.path.join(work, "idx-cache"),
                  DTRAIN_LOG_LEVEL="debug")
        before, n_before = mean_rows(dtrain, work, reps, off)
        after, n_after = mean_rows(dtrain, work, reps, on)
    if not before or not after:
        print("# a configuration had no completed run")
        return
    print(f"# {n_before} and {n_after} run(s); mean seconds; the critical path: the worker whose"
          " first step after the restart ended last")
    print(LEGEND)
    print("phase no_cache_s cache_s")
    for (name, a), (_, b) in zip(before, after):
        print(f"{name} {a:.3f} {b:.3f}")


if __name__ == "__main__":
    main()
