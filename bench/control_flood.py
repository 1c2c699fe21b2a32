#!/usr/bin/env python3
"""The launcher's memory while its control socket is flooded (run by scripts/bench-control-flood.sh).

Launches a two-worker job of `sleep`, then for SECONDS opens connections to the run's control
socket from FLOODERS processes, each writing junk lines and closing at once, as a hostile local
program could. Prints the launcher's resident memory (VmRSS) each second, its peak, the size of
launcher.log, and whether the job was still running at the end. Not a test: it prints figures.

    control_flood.py DTRAIN [SECONDS=30] [FLOODERS=4]
"""
import json
import multiprocessing
import os
import socket
import subprocess
import sys
import tempfile
import time


def flood(path, until):
    junk = b"x" * 200 + b"\n"
    while time.monotonic() < until:
        try:
            s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            s.connect(path)
            s.sendall(junk * 20)
            s.close()
        except OSError:
            time.sleep(0.001)


def rss_kib(pid):
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    return 0


def main():
    dtrain = sys.argv[1]
    seconds = float(sys.argv[2]) if len(sys.argv) > 2 else 30
    flooders = int(sys.argv[3]) if len(sys.argv) > 3 else 4
    work = tempfile.mkdtemp(prefix="dtrain-flood-")
    job = os.path.join(work, "job.json")
    run = os.path.join(work, "run")
    with open(job, "w") as f:
        json.dump({"job": "flood", "workers": 2, "command": ["sleep", "1000"],
                   "restart": {"max_restarts": 0, "grace_seconds": 1}}, f)
    log = open(os.path.join(work, "launcher.log"), "wb")
    launcher = subprocess.Popen([dtrain, "launch", job, "--run-dir", run], stdout=log, stderr=log)
    sock = os.path.join(run, "control.sock")
    deadline = time.monotonic() + 20
    while not os.path.exists(sock) and time.monotonic() < deadline:
        time.sleep(0.05)
    time.sleep(0.5)
    before = rss_kib(launcher.pid)
    until = time.monotonic() + seconds
    procs = [multiprocessing.Process(target=flood, args=(sock, until)) for _ in range(flooders)]
    for p in procs:
        p.start()
    samples = []
    while time.monotonic() < until:
        time.sleep(1)
        samples.append(rss_kib(launcher.pid) if launcher.poll() is None else 0)
    for p in procs:
        p.join()
    time.sleep(1)
    alive = launcher.poll() is None
    after = rss_kib(launcher.pid) if alive else 0
    launcher.terminate()
    launcher.wait(timeout=30)
    log.close()
    print(f"# {dtrain}: {flooders} flooders for {seconds:g} s")
    print("rss_before_mib rss_peak_mib rss_after_mib launcher_log_mib job_running_after")
    print(f"{before / 1024:.1f} {max(samples + [before]) / 1024:.1f} {after / 1024:.1f} "
          f"{os.path.getsize(os.path.join(work, 'launcher.log')) / 2**20:.2f} {alive}")
    print("rss_mib_per_second " + " ".join(f"{s / 1024:.0f}" for s in samples))


if __name__ == "__main__":
    main()
