#!/usr/bin/env python3
"""Where recovery time goes: a two-worker group of the main job's model and data (120 steps, a
step checkpoint every 50, back-off 0.2 s, `"recovery": "restart"`: the whole group restarts, as
it did before in-place recovery became the default) is launched, worker 1 is SIGKILLed after the
first checkpoint, and the time from the SIGKILL to the group's first completed step after the
restart is split into phases from events.jsonl (the launcher's side) and the workers' "start-up:" log
lines (worker/train/timeline.h). All on CLOCK_MONOTONIC. Two configurations side by side: without
the decompressed-IDX cache (DTRAIN_CACHE_DIR=off, as before it existed) and with it (warmed by
the first start). Run by scripts/bench-recovery.sh; prints "phase no_cache_s cache_s" rows
(means over the runs). Asserts nothing.

  recovery_breakdown.py DTRAIN [RUNS]
  recovery_breakdown.py --dtrain LABEL=PATH --dtrain LABEL=PATH ... [RUNS]

Several launchers (builds of two commits, say) run each configuration in turn, alternating run by
run, each with its own cache; then one row per launcher and configuration gives the total's
median and spread over the runs, and the phase table a column per launcher and configuration."""
import json
import os
import re
import signal
import statistics
import subprocess
import sys
import tempfile
import time

from launchers import worker_beside  # bench/launchers.py, beside this script

JOB = {
    "job": "recovery", "workers": 2, "recovery": "restart",
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


def environments(work, cache):
    """(name, environment) of the two configurations; cache: the folder of the IDX cache. The
    workers' "start-up:" timing line is at debug level."""
    return [("no_cache", dict(os.environ, DTRAIN_CACHE_DIR="off", DTRAIN_LOG_LEVEL="debug")),
            ("cache", dict(os.environ, DTRAIN_CACHE_DIR=os.path.join(work, cache),
                           DTRAIN_LOG_LEVEL="debug"))]


def alternate(pairs, reps):
    """Each launcher in pairs ((label, path)) runs each configuration reps times, launcher by
    launcher in turn, each with its own cache. Returns {(label, config): [completed runs' rows]}."""
    runs = {}
    with tempfile.TemporaryDirectory(prefix="dtrain-bench-recovery-") as work:
        for config in ("no_cache", "cache"):
            for rep in range(reps):
                for label, dtrain in pairs:
                    env = dict(environments(work, f"idx-cache-{label}"))[config]
                    rows = one_run(dtrain, work, f"{label}-{rep}", env)
                    runs.setdefault((label, config), []).extend([dict(rows)] if rows else [])
    return runs


def spread(values):
    """median min max, or three dashes when there are none."""
    if not values:
        return "- - -"
    return f"{statistics.median(values):.3f} {min(values):.3f} {max(values):.3f}"


def print_comparison(pairs, runs, reps):
    columns = [(label, config) for config in ("no_cache", "cache") for label, _ in pairs]
    print(f"# {reps} run(s) per launcher and configuration, alternating"
          f" {', '.join(label for label, _ in pairs)} run by run; seconds; the critical path:"
          " the worker whose first step after the restart ended last")
    print(LEGEND)
    print("launcher config runs total_median_s total_min_s total_max_s"
          " without_backoff_median_s without_backoff_min_s without_backoff_max_s")
    for label, config in columns:
        done = runs.get((label, config), [])
        print(f"{label} {config} {len(done)} {spread([r['total'] for r in done])}"
              f" {spread([r['total_without_backoff'] for r in done])}")
    print("# per phase: mean seconds over the completed runs")
    print("phase " + " ".join(f"{label}_{config}_s" for label, config in columns))
    names = []  # the phases in order; a build may log a phase the other does not
    for name in (name for done in runs.values() for r in done for name in r):
        if name not in names:
            names.append(name)
    for name in names:
        means = []
        for column in columns:
            values = [r[name] for r in runs.get(column, []) if name in r]
            means.append(f"{statistics.mean(values):.3f}" if values else "-")
        print(f"{name} {' '.join(means)}")


def arguments(argv):
    """(pairs, reps): [("", DTRAIN)] for the one-launcher form, else the --dtrain (label, path)."""
    usage = "usage: recovery_breakdown.py DTRAIN [RUNS] | --dtrain LABEL=PATH ... [RUNS]"
    pairs, rest = [], []
    while argv:
        if argv[0] == "--dtrain" and len(argv) > 1:
            label, _, path = argv[1].partition("=")
            if not re.fullmatch(r"[\w.+-]+", label) or not path:
                raise SystemExit(f"--dtrain {argv[1]}: LABEL=PATH (label: letters, digits, _.+-)")
            if not os.access(path, os.X_OK) or not worker_beside(path):
                raise SystemExit(f"--dtrain {argv[1]}: no launcher there, or no dtrain-worker"
                                 " beside it or in ../worker")
            pairs.append((label, os.path.realpath(path)))
            argv = argv[2:]
        elif argv[0].startswith("-") or len(rest) == 2:
            raise SystemExit(usage)
        else:
            rest, argv = rest + [argv[0]], argv[1:]
    if not pairs:
        if not rest:
            raise SystemExit(usage)
        return [("", rest[0])], int(rest[1]) if len(rest) > 1 else 5
    if len({label for label, _ in pairs}) < len(pairs) or len(rest) > 1:
        raise SystemExit(f"--dtrain: each label once, then at most RUNS; {usage}")
    return pairs, int(rest[0]) if rest else 5


def main():
    pairs, reps = arguments(sys.argv[1:])
    if pairs[0][0]:
        print_comparison(pairs, alternate(pairs, reps), reps)
        return
    dtrain = pairs[0][1]
    with tempfile.TemporaryDirectory(prefix="dtrain-bench-recovery-") as work:
        (_, off), (_, on) = environments(work, "idx-cache")
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
