#!/usr/bin/env python3
"""chaos.sh's reading of a chaos run's events.jsonl: one summary line, and the `frozen` verdicts
against workers the script never stopped (docs/testing.md#a-slow-disk-and-a-busy-machine).

  chaos_events.py EVENTS_JSONL STOPPED_PIDS

STOPPED_PIDS lists every pid chaos.sh sent SIGSTOP. A frozen verdict names the worker's own pid
(worker_pid, from its progress record; pid is the launcher's child, an ssh client for a remote
worker); one not in the list was a healthy worker killed. Those verdicts are written, one JSON
object a line, to STOPPED_PIDS.wrong. Exits 0, or 1 when there is any.
"""
import json
import sys


def main():
    events = [json.loads(line) for line in open(sys.argv[1]) if line.strip()]
    stopped = set(open(sys.argv[2]).read().split())
    wrong = [e for e in events if e["event"] == "frozen" and "task" in e
             and str(e.get("worker_pid", e.get("pid"))) not in stopped]
    with open(sys.argv[2] + ".wrong", "w") as out:
        out.write("".join(json.dumps(e) + "\n" for e in wrong))

    def count(kind):
        return sum(1 for e in events if e["event"] == kind)

    rec = [e for e in events if e["event"] == "recovered"]
    in_place = [e for e in rec if e.get("path") == "in_place"]
    secs = sorted(e["seconds"] for e in in_place if "seconds" in e)
    median = secs[len(secs) // 2] if secs else 0
    redone = sum(e.get("steps_redone", 0) for e in rec)
    print(f"{count('in_place')} in-place replacements, {count('frozen')} frozen found "
          f"({len(wrong)} of them healthy, {count('stall')} stall warnings), "
          f"{count('restart')} whole-group restarts; {len(in_place)} recoveries in place "
          f"(median {median:.2f} s, max {max(secs) if secs else 0:.2f} s), "
          f"{redone} steps redone in all")
    return 1 if wrong else 0


if __name__ == "__main__":
    sys.exit(main())
