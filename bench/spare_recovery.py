#!/usr/bin/python3
"""Recovery with a spare (issue 26): the main job's model and data (configs/
fashion-mnist-2workers.json), two workers and one spare, in place; worker 1 is SIGKILLed
--kills times, each once the current spare says it waits to be promoted and --every seconds
have passed. Per kill: the `recovered` event's `seconds` (the failed end to the new generation's
first step, events.jsonl) and the promoted spare's phases from its "start-up:" line
(worker/train/timeline.h, CLOCK_MONOTONIC): rendezvous (from the launcher's `promoted` event),
model, broadcast, first step. Several builds side by side
(--dtrain, repeated), alternated run by run, so that they share the machine's state. Prints one
row per kill and the medians per build. Asserts nothing; every wait has a time-out.
"""
import argparse
import json
import os
import re
import signal
import statistics
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
STARTUP = re.compile(r"start-up: main at CLOCK_MONOTONIC ([\d.]+)((?:; [^;+]+ \+[\d.]+ s)*)")
PHASE = re.compile(r"; ([^;+]+) \+([\d.]+) s")
PHASES = ("rendezvous", "model", "broadcast", "first step")


def read(path):
    try:
        with open(path, errors="replace") as f:
            return f.read()
    except OSError:
        return ""


def events(run, kind):
    out = []
    for line in read(os.path.join(run, "events.jsonl")).splitlines():
        try:
            e = json.loads(line)
        except ValueError:
            continue
        if e.get("event") == kind:
            out.append(e)
    return out


def pid_of(run, task):
    try:
        with open(os.path.join(run, "state.json")) as f:
            state = json.load(f)
    except (OSError, ValueError):
        return 0
    return next((w.get("pid") or 0 for w in state.get("workers", []) if w.get("task") == task
                 and w.get("state") == "running"), 0)


def wait_for(what, condition, timeout):
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise TimeoutError(f"waited {timeout:.0f} s for {what}")
        time.sleep(0.02)


def one_run(dtrain, env_items, folder, args):
    with open(os.path.join(ROOT, "configs", "fashion-mnist-2workers.json")) as f:
        job = json.load(f)
    job.pop("cluster", None)
    job.update({"job": "spare-recovery", "workers": 2, "spares": 1, "recovery": "in_place"})
    job["restart"]["max_restarts"] = args.kills + 3
    job.setdefault("env", {})["DTRAIN_LOG_LEVEL"] = "debug"  # the "start-up:" lines
    for key, value in env_items:
        job["env"][key] = value
    job["train"].update(epochs=1, steps_per_epoch=100000, validation=False, tensorboard=False)
    job["train"]["backup"].update(save_freq="epoch", delete_on_success=False)
    path = os.path.join(folder, "job.json")
    with open(path, "w") as f:
        json.dump(job, f)
    run = os.path.join(folder, "run")
    env = dict(os.environ, NO_COLOR="1")
    env.pop("OMP_NUM_THREADS", None)
    env.pop("DTRAIN_LOG_LEVEL", None)
    with open(os.path.join(folder, "launcher.log"), "w") as log:
        launcher = subprocess.Popen([dtrain, "launch", path, "--run-dir", run], env=env,
                                    stdin=subprocess.DEVNULL, stdout=log,
                                    stderr=subprocess.STDOUT, start_new_session=True)
    spare_log = os.path.join(run, "logs", "spare-0.log")
    kills = []
    try:
        for k in range(args.kills):
            wait_for("the spare", lambda: read(spare_log).count("waiting to be promoted") > k, 60)
            time.sleep(args.every)
            wait_for("worker 1", lambda: pid_of(run, "worker:1") > 0, 30)
            pid = pid_of(run, "worker:1")
            os.kill(pid, signal.SIGKILL)
            kills.append(time.monotonic())
            wait_for("the recovery", lambda: len(events(run, "recovered")) > k, 60)
    finally:
        try:
            os.killpg(launcher.pid, signal.SIGTERM)
            launcher.wait(timeout=30)
        except (ProcessLookupError, subprocess.TimeoutExpired):
            os.killpg(launcher.pid, signal.SIGKILL)
    seconds = [e.get("seconds") for e in events(run, "recovered")]
    promoted = [e["mono"] for e in events(run, "promoted")]
    # worker-1.log: the first worker 1's start-up, then each promoted spare's.
    out = []
    for i, m in enumerate(list(STARTUP.finditer(read(os.path.join(run, "logs",
                                                                  "worker-1.log"))))[1:]):
        at, marks = float(m.group(1)), {}
        for name, s in PHASE.findall(m.group(2)):
            at += float(s)
            marks[name] = at
        phases, before = {}, promoted[i] if i < len(promoted) else None
        for name in PHASES:
            if before is not None and name in marks:
                phases[name] = marks[name] - before
            before = marks.get(name)
        out.append(phases)
    return [(seconds[i] if i < len(seconds) else None, out[i] if i < len(out) else {})
            for i in range(len(kills))]


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--dtrain", action="append", required=True,
                        help="'LABEL=PATH [KEY=VALUE ...]': a dtrain launcher and variables for the "
                        "job's env (repeat for each build)")
    parser.add_argument("--runs", type=int, default=3, help="launches per build")
    parser.add_argument("--kills", type=int, default=3, help="kills per launch")
    parser.add_argument("--every", type=float, default=2.0,
                        help="seconds from the spare's readiness to the next kill")
    parser.add_argument("--keep", help="keep the run folders here (default: a temporary one)")
    args = parser.parse_args()
    builds = []
    for b in args.dtrain:
        words = b.split()
        label, dtrain = words[0].split("=", 1) if "=" in words[0] else (words[0], words[0])
        builds.append((label, dtrain, [w.split("=", 1) for w in words[1:]]))
    print(f"# bench/spare_recovery.py: {os.cpu_count()} cores, {args.runs} runs x {args.kills} "
          f"kills per build, kill {args.every} s after the spare is ready")
    print(f"{'build':10} {'run':>3} {'recovered_s':>11} " +
          " ".join(f"{p.replace(' ', '_'):>10}" for p in PHASES))
    rows = {label: [] for label, _, _ in builds}
    with tempfile.TemporaryDirectory(prefix="spare-recovery-") as temporary:
        work = args.keep or temporary
        for r in range(args.runs):
            order = builds if r % 2 == 0 else builds[::-1]
            for label, dtrain, env_items in order:
                folder = os.path.join(work, f"{label}-{r}")
                os.makedirs(folder)
                for seconds, phases in one_run(dtrain, env_items, folder, args):
                    rows[label].append((seconds, phases))
                    cells = " ".join(f"{phases.get(p, float('nan')):10.3f}" for p in PHASES)
                    print(f"{label:10} {r:3} {seconds if seconds is not None else float('nan'):11.3f}"
                          f" {cells}", flush=True)
    print("# medians")
    for label, got in rows.items():
        def median(values):
            values = [v for v in values if v is not None]
            return statistics.median(values) if values else float("nan")
        cells = " ".join(f"{median([ph.get(p) for _, ph in got]):10.3f}" for p in PHASES)
        print(f"{label:10} {'all':>3} {median([s for s, _ in got]):11.3f} {cells}")


if __name__ == "__main__":
    sys.exit(main())
