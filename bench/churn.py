#!/usr/bin/python3
"""Goodput under churn (issue 26): the main job's model and data trained by several systems, each
undisturbed ("calm") and then with a random training worker SIGKILLed every K seconds, side by
side in one run. Run by scripts/bench-churn.sh; prints a header and a table with the columns
`system K calm_s churn_s goodput kills same_model recovery_mean_s recovery_max_s`.

Systems: `in_place` and `restart` (dtrain with that `"recovery"`), `in_place+spare` (in place
with `"spares": 1`: a standby worker takes a killed one's place), `torchrun` (bench/cnn_ddp.py,
the same CNN in PyTorch DDP over gloo with epoch checkpoints, under torchrun --max_restarts).
Several launchers (`--dtrain LABEL=PATH`, repeated: builds of two commits) each run every dtrain
system, alternating run by run, and the table gains a `launcher` column.
The job is configs/fashion-mnist-2workers.json with the epochs and steps asked for, epoch
checkpoints only, no validation and no TensorBoard (the PyTorch program does neither).

goodput = calm wall / churn wall. same_model: the churn run ended with the calm run's weights
(sha256 of dtrain's model.safetensors; cnn_ddp.py's own sha256 of its weights). Recovery: per
kill, from the SIGKILL to the group's next completed step, read from the workers' "first step of
this run done (CLOCK_MONOTONIC X)" lines (time.monotonic() is CLOCK_MONOTONIC on Linux); for a
kill that began an in-place recovery, the `seconds` of its `recovered` event in events.jsonl
instead. The victims come from one seeded random generator per K, so runs repeat. Every wait has a time-out;
each system runs in its own process group, ended on exit, Ctrl-C or SIGTERM. Asserts nothing.
"""
import argparse
import glob
import hashlib
import json
import os
import random
import re
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time

from launchers import worker_beside  # bench/launchers.py, beside this script

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
PYTHON = "/usr/bin/python3"  # Debian's, with torch (python3 on PATH may not have it)
FIRST_STEP = re.compile(r"first step of this run done \(CLOCK_MONOTONIC ([\d.]+)\)")
POLL = 0.02
GRACE = 20  # seconds a system gets after SIGTERM before SIGKILL
STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)
TORCH_MALLOC = "glibc.malloc.mmap_threshold=33554432:glibc.malloc.trim_threshold=4294967295"


class Interrupted(Exception):
    pass


def on_signal(number, _frame):
    raise Interrupted(signal.Signals(number).name)


# ---- processes -------------------------------------------------------------------------------


def proc_alive(pid):
    """pid runs and is not a zombie."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def proc_text(pid, name):
    try:
        with open(f"/proc/{pid}/{name}", "rb") as f:
            return f.read().replace(b"\0", b" ").decode(errors="replace")
    except OSError:
        return ""


def all_pids():
    return [int(p) for p in os.listdir("/proc") if p.isdigit()]


def children(pid):
    out = []
    for p in all_pids():
        try:
            with open(f"/proc/{p}/stat") as f:
                if int(f.read().rsplit(")", 1)[1].split()[1]) == pid:
                    out.append(p)
        except (OSError, IndexError, ValueError):
            pass
    return out


def stop(process, marker):
    """Ends a system: SIGTERM to its process group, SIGKILL after GRACE; then any process left
    whose command line or environment names marker (its run folder): dtrain's workers run in
    their own process groups. Stop signals wait until it is done."""
    held = signal.pthread_sigmask(signal.SIG_BLOCK, STOP_SIGNALS)
    try:
        end_processes(process, marker)
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, held)


def end_processes(process, marker):
    if process.poll() is None:
        for sig, wait in ((signal.SIGTERM, GRACE), (signal.SIGKILL, 5)):
            try:
                os.killpg(process.pid, sig)
            except ProcessLookupError:
                pass
            try:
                process.wait(timeout=wait)
                break
            except subprocess.TimeoutExpired:
                pass
    else:  # its group may outlive it
        try:
            os.killpg(process.pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass
    mine = os.getpid()
    for _ in range(50):
        left = [p for p in all_pids() if p != mine and proc_alive(p)
                and (marker in proc_text(p, "cmdline") or marker in proc_text(p, "environ"))]
        if not left:
            return
        for p in left:
            try:
                os.kill(p, signal.SIGKILL)
            except ProcessLookupError:
                pass
        time.sleep(0.1)
    print(f"# warning: processes of {marker} survived SIGKILL", file=sys.stderr)


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def sha256(path):
    try:
        with open(path, "rb") as f:
            return hashlib.sha256(f.read()).hexdigest()
    except OSError:
        return None


def first_step_times(paths):
    times = []
    for path in paths:
        try:
            with open(path, errors="replace") as f:
                times += [float(t) for t in FIRST_STEP.findall(f.read())]
        except OSError:
            pass
    return sorted(times)


def recoveries_from_logs(kills, paths):
    """Per kill: seconds to the first "first step" line after it; None when there is none."""
    times = first_step_times(paths)
    return [next((t - k for t in times if t > k), None) for k in kills]


# ---- systems ---------------------------------------------------------------------------------


class Dtrain:
    """dtrain launch of the main job with `"recovery": mode`, by the launcher dtrain; label names
    that launcher when several are compared ("" when one is)."""

    def __init__(self, name, dtrain, label, config, args):
        self.name, self.dtrain, self.label, self.note = name, dtrain, label, ""
        self.id = f"{name}@{label}" if label else name
        mode, spares = (name[:-len("+spare")], 1) if name.endswith("+spare") else (name, 0)
        with open(config) as f:
            job = json.load(f)
        job.pop("cluster", None)
        job["workers"] = 2
        job["job"] = f"churn-{mode}" + ("-spare" if spares else "")
        job["recovery"] = mode
        if spares:
            job["spares"] = spares
        job.setdefault("env", {})["DTRAIN_LOG_LEVEL"] = "debug"  # the "first step" line
        train = job["train"]
        train.update(epochs=args.epochs, steps_per_epoch=args.steps, validation=False,
                     tensorboard=False)
        train["backup"].update(save_freq="epoch")
        self.job = job

    def check(self, work):
        """None when `dtrain validate` takes the job, else why not. A build from before in-place
        recovery refuses the "recovery" key; it restarts the whole group, so the restart system
        runs without the key there."""
        path = os.path.join(work, f"validate-{self.id}.json")
        for attempt in range(2):
            with open(path, "w") as f:
                json.dump(self.job, f)
            out = subprocess.run([self.dtrain, "validate", path], capture_output=True,
                                 text=True, timeout=60)
            if out.returncode == 0:
                return None
            if attempt == 0 and self.name == "restart" and '"recovery"' in out.stderr:
                del self.job["recovery"]
                self.note = "(this build has no \"recovery\" key: restart is its only path)"
                continue
            return out.stderr.strip().splitlines()[-1] if out.stderr.strip() else "refused"

    def start(self, folder, log):
        path = os.path.join(folder, "job.json")
        with open(path, "w") as f:
            json.dump(self.job, f, indent=1)
        env = dict(os.environ, NO_COLOR="1")
        env.pop("OMP_NUM_THREADS", None)  # the launcher gives each worker cores / workers
        env.pop("DTRAIN_LOG_LEVEL", None)
        return subprocess.Popen([self.dtrain, "launch", path, "--run-dir",
                                 os.path.join(folder, "run")], env=env, stdin=subprocess.DEVNULL,
                                stdout=log, stderr=subprocess.STDOUT, start_new_session=True)

    def workers(self, process, folder):
        """Live training workers' pids, by task index, from state.json."""
        try:
            with open(os.path.join(folder, "run", "state.json")) as f:
                state = json.load(f)
        except (OSError, ValueError):
            return []
        live = []
        for w in sorted(state.get("workers", []), key=lambda w: task_order(w.get("task", ""))):
            kind = w.get("task", "").split(":")[0]
            pid = w.get("pid") or 0
            if kind in ("worker", "chief") and w.get("state") == "running" and pid > 0 \
                    and proc_alive(pid) and "dtrain-worker" in proc_text(pid, "cmdline"):
                live.append(pid)
        return live

    def model(self, folder):
        return sha256(os.path.join(folder, "run", "model", "model.safetensors"))

    def epochs_done(self, folder):
        try:
            with open(os.path.join(folder, "run", "metrics.jsonl")) as f:
                return max([json.loads(line)["epoch"] for line in f if line.strip()], default=0)
        except (OSError, ValueError, KeyError):
            return 0

    def recoveries(self, folder, kills):
        """Per kill: the `seconds` of the `recovered` event whose recovery it began (in place:
        the event's time less its seconds, the failed end, lies within a second after the kill),
        else from the logs (a kill during a recovery in progress only extends it, and the
        launcher counts that one from the first failure). Returns (those, where they came
        from, the logs' figures)."""
        run = os.path.join(folder, "run")
        logs = recoveries_from_logs(kills, glob.glob(os.path.join(run, "logs", "*.log")))
        try:
            with open(os.path.join(run, "events.jsonl")) as f:
                events = [json.loads(line) for line in f if line.strip()]
        except (OSError, ValueError):
            events = []
        recovered = [e for e in events if e.get("event") == "recovered"]
        chosen, sources = [], set()
        for i, kill in enumerate(kills):
            event = next((e for e in recovered if "seconds" in e and "mono" in e
                          and 0 <= e["mono"] - e["seconds"] - kill < 1.0), None)
            if event is not None:
                chosen.append(event["seconds"])
                sources.add(f"events ({event.get('path', '?')})")
            else:
                chosen.append(logs[i])
                sources.add("logs")
        return chosen, " + ".join(sorted(sources)) or "logs", logs


def task_order(task):
    kind, _, index = task.partition(":")
    return (kind != "chief", int(index) if index.isdigit() else 0)


class Torchrun:
    """bench/cnn_ddp.py under torchrun (through bench/torchrun311.py), restarted by torchrun."""

    name = id = "torchrun"
    label, note = "", ""

    def __init__(self, args, config):
        with open(config) as f:
            job = json.load(f)
        train = job["train"]
        optimizer = train["optimizer"]
        rate = optimizer["learning_rate"]
        base = rate["initial_learning_rate"] if isinstance(rate, dict) else rate
        self.program = ["--epochs", str(args.epochs), "--steps", str(args.steps),
                        "--batch", str(train["per_worker_batch_size"]), "--lr", str(base),
                        "--momentum", str(optimizer.get("momentum", 0.0)),
                        "--seed", str(train.get("seed", 42)), "--data", train["data"]["dir"]]
        self.max_restarts, self.monitor = args.torch_max_restarts, args.torch_monitor_interval
        self.threads = args.threads

    def start(self, folder, log):
        # glibc keeps freed blocks, as the jemalloc or tcmalloc of PyTorch's CPU tuning guide
        # would: otherwise each step page-faults through the gradients it allocates anew
        # (scripts/torch-at-best.sh).
        env = dict(os.environ, OMP_NUM_THREADS=str(self.threads), PYTHONUNBUFFERED="1",
                   GLIBC_TUNABLES=TORCH_MALLOC)
        command = [PYTHON, os.path.join(HERE, "torchrun311.py"), "--nnodes", "1",
                   "--nproc_per_node", "2", "--max_restarts", str(self.max_restarts),
                   "--monitor_interval", str(self.monitor), "--rdzv_backend", "c10d",
                   "--rdzv_endpoint", f"127.0.0.1:{free_port()}", "--rdzv_id", "churn",
                   os.path.join(HERE, "cnn_ddp.py"), "--dir", os.path.join(folder, "out")]
        return subprocess.Popen(command + self.program, env=env, stdin=subprocess.DEVNULL,
                                stdout=log, stderr=subprocess.STDOUT, start_new_session=True)

    def workers(self, process, folder):
        """The agent's live children running cnn_ddp.py, by RANK (from /proc, not pid files)."""
        live = []
        for pid in children(process.pid):
            if proc_alive(pid) and "cnn_ddp.py" in proc_text(pid, "cmdline"):
                rank = re.search(r"(?:^| )RANK=(\d+)", proc_text(pid, "environ"))
                live.append((int(rank.group(1)) if rank else 99, pid))
        return [pid for _, pid in sorted(live)]

    def model(self, folder):
        try:
            with open(os.path.join(folder, "out", "result.json")) as f:
                return json.load(f)["sha256"]
        except (OSError, ValueError, KeyError):
            return None

    def epochs_done(self, folder):
        try:
            with open(os.path.join(folder, "output.log"), errors="replace") as f:
                return max(map(int, re.findall(r"rank 0: epoch (\d+)/", f.read())), default=0)
        except OSError:
            return 0

    def recoveries(self, folder, kills):
        logs = recoveries_from_logs(kills, [os.path.join(folder, "output.log")])
        return logs, "logs", logs

    def check(self, work):
        return None if os.path.exists(PYTHON) else f"no {PYTHON}"


# ---- one run ---------------------------------------------------------------------------------


def run_once(system, work, k, seed, timeout):
    """One run of system, calm (k None) or with a kill every k seconds. Returns a dict: status
    ("ok", "exit N", "timeout"), wall, kills (CLOCK_MONOTONIC), model, recoveries."""
    folder = os.path.join(work, f"{system.id}-{k or 'calm'}")
    os.makedirs(folder)
    log_path = os.path.join(folder, "output.log")
    rng = random.Random(f"{seed}-{k}")  # the same kill choices for every system at one K
    kills, victims = [], []
    with open(log_path, "wb") as log:
        started = time.monotonic()
        process = system.start(folder, log)
        try:
            next_kill = started + k if k else None
            status = None
            while process.poll() is None:
                now = time.monotonic()
                if now - started > timeout:
                    status = "timeout"
                    break
                if next_kill is not None and now >= next_kill:
                    live = system.workers(process, folder)
                    if live:  # else at the first moment one is running again
                        index = rng.randrange(len(live))
                        try:
                            when = time.monotonic()
                            os.kill(live[index], signal.SIGKILL)
                            kills.append(when)
                            victims.append(index)
                            next_kill += k * (1 + int((time.monotonic() - next_kill) // k))
                        except ProcessLookupError:
                            pass
                time.sleep(POLL)
            wall = time.monotonic() - started
            if status is None:
                status = "ok" if process.returncode == 0 else f"exit {process.returncode}"
        finally:
            stop(process, folder)
    result = {"status": status, "wall": wall, "kills": kills, "folder": folder,
              "kill_log": " ".join(f"{t - started:.1f}:w{i}" for t, i in zip(kills, victims)),
              "epochs_done": system.epochs_done(folder),
              "model": system.model(folder) if status == "ok" else None}
    if k:
        result["recoveries"], result["source"], result["log_recoveries"] = \
            system.recoveries(folder, kills)
    return result


def tail(path, lines=8):
    try:
        with open(path, errors="replace") as f:
            return "".join(f.readlines()[-lines:])
    except OSError:
        return ""


# ---- report ----------------------------------------------------------------------------------


def machine_line(threads):
    cpu = "?"
    try:
        lscpu = subprocess.run(["lscpu"], capture_output=True, text=True, timeout=10).stdout
        cpu = re.search(r"Model name:\s*(.+)", lscpu).group(1).strip()
    except (OSError, subprocess.SubprocessError, AttributeError):
        pass
    load = " ".join(f"{x:.2f}" for x in os.getloadavg())
    return (f"# {cpu}, {os.cpu_count()} cores, load {load}; threads per worker: dtrain the"
            f" launcher's OMP_NUM_THREADS = cores / workers = {max(1, (os.cpu_count() or 2) // 2)},"
            f" PyTorch OMP_NUM_THREADS = torch.set_num_threads = {threads}")


def torch_line():
    """torch's version and the BLAS library its process maps after a matrix product."""
    code = ("import torch; torch.ones(64, 64) @ torch.ones(64, 64); "
            "print(torch.__version__); "
            "print(' '.join(sorted({l.split()[-1] for l in open('/proc/self/maps') "
            "if 'blas' in l.lower() and '.so' in l})))")
    try:
        out = subprocess.run([PYTHON, "-c", code], capture_output=True, text=True, timeout=120)
        version, blas = (out.stdout.splitlines() + ["?", ""])[:2]
    except (OSError, subprocess.SubprocessError):
        version, blas = "?", ""
    folders = sorted({os.path.dirname(path) for path in blas.split()})
    names = " ".join(os.path.basename(path) for path in blas.split())
    return f"# torch {version}, BLAS mapped: {names or 'none'} (in {', '.join(folders)})"


def fmt(x, digits=1):
    return "-" if x is None else f"{x:.{digits}f}"


def row(name, k, calm, churn):
    ok = calm["status"] == "ok" and churn["status"] == "ok"
    churn_s = fmt(churn["wall"]) if churn["status"] == "ok" else churn["status"].replace(" ", "_")
    goodput = fmt(calm["wall"] / churn["wall"], 2) if ok else "-"
    same = str(churn["model"] == calm["model"]) if ok and calm["model"] else "-"
    times = [t for t in churn.get("recoveries", []) if t is not None]
    mean = fmt(statistics.mean(times), 2) if times else "-"
    top = fmt(max(times), 2) if times else "-"
    return (f"{name:<9} {k:<3} {fmt(calm['wall']):>7} {churn_s:>8} {goodput:>7} "
            f"{len(churn['kills']):>5} {same:>10} {mean:>15} {top:>14}")


def parse_args():
    parser = argparse.ArgumentParser(
        description="Goodput under churn: dtrain (in place, restart) and torchrun, calm and with"
                    " a training worker SIGKILLed every K seconds.",
        formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    parser.add_argument("--dtrain", action="append", metavar="PATH | LABEL=PATH",
                        help="the launcher (dtrain-worker beside it or in ../worker); repeated as"
                             " LABEL=PATH, launchers to compare: each runs every dtrain system,"
                             " alternating run by run (default: build/launcher/dtrain)")
    parser.add_argument("--config", help="the job whose model, data and optimizer are used",
                        default=os.path.join(ROOT, "configs", "fashion-mnist-2workers.json"))
    parser.add_argument("--systems", default="in_place,in_place+spare,restart,torchrun",
                        help="comma-separated: in_place, in_place+spare (one spare), restart, "
                             "torchrun")
    parser.add_argument("--epochs", type=int, default=12, help="epochs")
    parser.add_argument("--steps", type=int, default=200, help="steps per epoch")
    parser.add_argument("--every", default="10,5", help="K values: seconds between kills")
    parser.add_argument("--seed", type=int, default=26, help="of the kill choices")
    parser.add_argument("--timeout", type=float, default=900,
                        help="seconds a calm run may take")
    parser.add_argument("--timeout-factor", type=float, default=6,
                        help="a churn run may take this times the calm wall (at least 120 s)")
    parser.add_argument("--threads", type=int, default=max(1, (os.cpu_count() or 2) // 2),
                        help="OMP_NUM_THREADS per PyTorch rank (dtrain's launcher gives "
                             "cores / workers)")
    parser.add_argument("--torch-max-restarts", type=int, default=100,
                        help="torchrun --max_restarts")
    parser.add_argument("--torch-monitor-interval", type=float, default=1.0,
                        help="torchrun's poll of its workers (its default: 5 s)")
    parser.add_argument("--keep", help="keep the run folders here (default: a temporary one)")
    return parser.parse_args()


def launchers(values):
    """--dtrain's values as (label, path): one PATH (label ""), or LABEL=PATH each."""
    if not values:
        return [("", os.path.join(ROOT, "build", "launcher", "dtrain"))]
    if len(values) == 1 and "=" not in values[0]:
        return [("", values[0])]
    pairs = []
    for value in values:
        label, _, path = value.partition("=")
        if not re.fullmatch(r"[\w.+-]+", label) or not path:
            sys.exit(f"--dtrain {value!r}: LABEL=PATH each when several (label: letters, digits,"
                     " _ . + -)")
        if not os.access(path, os.X_OK) or not worker_beside(path):
            sys.exit(f"--dtrain {value!r}: no launcher there, or no dtrain-worker beside it or"
                     " in ../worker")
        pairs.append((label, os.path.realpath(path)))
    if len({label for label, _ in pairs}) < len(pairs):
        sys.exit("--dtrain: each label once")
    return pairs


def make_systems(args):
    """The systems in run order: each dtrain system once per launcher, side by side."""
    pairs = launchers(args.dtrain)
    systems = []
    for name in args.systems.split(","):
        if name in ("in_place", "in_place+spare", "restart"):
            systems += [Dtrain(name, path, label, args.config, args) for label, path in pairs]
        elif name == "torchrun":
            systems.append(Torchrun(args, args.config))
        else:
            sys.exit(f"--systems: unknown system {name!r} "
                     "(in_place, in_place+spare, restart, torchrun)")
    return systems, pairs


def main():
    args = parse_args()
    for number in STOP_SIGNALS:
        signal.signal(number, on_signal)
    every = [float(k) if "." in k else int(k) for k in args.every.split(",") if k]
    systems, pairs = make_systems(args)
    print(machine_line(args.threads))
    if any(s.name == "torchrun" for s in systems):
        print(torch_line())
    if pairs[0][0]:
        print("# launchers, each running every dtrain system, alternating run by run: " +
              ", ".join(f"{label} = {path} (worker {worker_beside(path)})"
                        for label, path in pairs))
    print(f"# {args.epochs} epochs x {args.steps} steps, 2 workers x batch 64, epoch checkpoints;"
          f" kills every {args.every} s (seed {args.seed}); torchrun --monitor_interval "
          f"{args.torch_monitor_interval:g}", flush=True)
    work = args.keep or tempfile.mkdtemp(prefix="dtrain-churn-")
    os.makedirs(work, exist_ok=True)
    usable = []
    for system in systems:
        why = system.check(work)
        if why:
            print(f"# {system.id}: not run: {why}")
        else:
            usable.append(system)
            if system.note:
                print(f"# {system.id}: {system.note}")
    systems = usable
    results = {}
    try:
        for k in [None] + every:  # every system at one K before the next K: drift hits all
            for system in systems:
                calm = results.get((system.id, None))
                if k and calm and calm["status"] != "ok":
                    continue
                timeout = args.timeout if k is None else max(120.0,
                                                             args.timeout_factor * calm["wall"])
                r = run_once(system, work, k, args.seed, timeout)
                results[(system.id, k)] = r
                note = f"{r['status']}, {r['wall']:.1f} s, {len(r['kills'])} kill(s)"
                if r["status"] != "ok":
                    note += f", {r['epochs_done']} of {args.epochs} epochs done"
                    note += "\n" + tail(os.path.join(r["folder"], "output.log"))
                print(f"# {system.id} {'calm' if k is None else f'K={k}'}: {note}",
                      file=sys.stderr, flush=True)
    except Interrupted as e:
        print(f"# interrupted ({e}): the runs so far", file=sys.stderr)
    finally:
        report(systems, every, args.epochs, results)
        if not args.keep:
            subprocess.run(["rm", "-rf", work], timeout=120)


def report(systems, every, epochs, results):
    """The table, a row per system and K (and launcher, a column when several are compared),
    then each failed run, recovery and kill time as comments."""
    labelled = any(system.label for system in systems)
    print(("launcher   " if labelled else "") + "system    K    calm_s  churn_s goodput kills"
          " same_model recovery_mean_s recovery_max_s")
    for system in systems:
        launcher = f"{system.label or '-':<10} " if labelled else ""
        calm = results.get((system.id, None))
        for k in every:
            churn = results.get((system.id, k))
            if calm and churn:
                print(launcher + row(system.name, k, calm, churn))
            elif calm:
                print(f"{launcher}{system.name:<9} {k:<3} {fmt(calm['wall']):>7} "
                      f"{'-' if calm['status'] == 'ok' else calm['status'].replace(' ', '_'):>8}")
    for system in systems:
        for k in [None] + every:
            r = results.get((system.id, k))
            if r and r["status"] != "ok":
                print(f"# {system.id} {'calm' if k is None else f'K={k}'}: {r['status']} after"
                      f" {r['wall']:.1f} s, {r['epochs_done']} of {epochs} epochs done")
        for k in every:
            r = results.get((system.id, k))
            if r and r["kills"] and r.get("recoveries") is not None:
                each = " ".join(fmt(t, 2) for t in r["recoveries"])
                line = f"# {system.id} K={k} recoveries ({r['source']}): {each}"
                if r["source"] != "logs":
                    logs = " ".join(fmt(t, 2) for t in r["log_recoveries"])
                    line += f"; from SIGKILL (logs): {logs}"
                print(line)
                print(f"# {system.id} K={k} kills (s from the start:worker): {r['kill_log']}")
    print("# recoveries: seconds from each SIGKILL to the group's next completed step (logs), or"
          " the launcher's `recovered` seconds (events: from its notice of the failure);"
          " -: no step after it (the end of the run)")
    sys.stdout.flush()


if __name__ == "__main__":
    main()
