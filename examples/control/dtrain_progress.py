"""Heartbeats and progress from any program to the dtrain launcher (docs/control.md).

    import dtrain_progress
    dtrain_progress.progress(epoch=1, epochs=3, step=10, steps=70, loss=0.42)
    dtrain_progress.heartbeat()

Both return True when the line was sent, and do nothing (False) when DTRAIN_CONTROL is unset.
"""
import json
import os
import socket

_sock = None


def _send(message):
    global _sock
    address = os.environ.get("DTRAIN_CONTROL", "")
    if not address.startswith("unix:"):
        return False
    task = json.loads(os.environ.get("TF_CONFIG") or "{}").get("task", {})
    message.update(task="%s:%s" % (task.get("type", "worker"), task.get("index", 0)),
                   attempt=int(os.environ.get("DTRAIN_ATTEMPT", "0")), pid=os.getpid())
    line = (json.dumps(message) + "\n").encode()
    for _ in range(2):  # the launcher closes idle connections: one fresh try
        try:
            if _sock is None:
                _sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
                _sock.settimeout(1.0)
                _sock.connect(address[len("unix:"):])
            _sock.sendall(line)
            return True
        except OSError:
            if _sock is not None:
                _sock.close()
            _sock = None
    return False


def heartbeat():
    return _send({"type": "heartbeat"})


def progress(epoch=None, epochs=None, step=None, steps=None, loss=None, accuracy=None,
             samples_per_second=None):
    counts = dict(epoch=epoch, epochs=epochs, step=step, steps=steps)
    rates = dict(loss=loss, accuracy=accuracy, samples_per_second=samples_per_second)
    message = {k: int(v) for k, v in counts.items() if v is not None}
    # NaN or infinity is no JSON number: the launcher would drop the whole line.
    message.update({k: float(v) for k, v in rates.items() if v is not None and abs(v) < 1e300})
    message["type"] = "progress"
    return _send(message)
