"""What the benchmarks that compare launchers share (bench/churn.py, bench/recovery_breakdown.py,
run with --dtrain LABEL=PATH): which dtrain-worker a launcher binary runs."""
import os


def worker_beside(launcher):
    """The dtrain-worker that launcher runs: beside it or in ../worker, where
    launcher/plan/run_preparation.cc looks; None when neither is (it would take PATH's)."""
    folder = os.path.dirname(os.path.realpath(launcher))
    for path in (os.path.join(folder, "dtrain-worker"),
                 os.path.join(os.path.dirname(folder), "worker", "dtrain-worker")):
        if os.access(path, os.X_OK):
            return path
    return None
