#!/usr/bin/env bash
# Users' own data (issue 27), side by side in one run, two workers on this machine, the main
# job's CNN and recipe:
#   idx / npz / npz_file   Fashion-MNIST from Debian's IDX files, the same as Keras's npz
#                          (np.savez from the IDX files), and that npz sharded by file: the
#                          models' SHA-256 and val_accuracy (npz must equal idx bit for bit);
#                          npz and npz_file again for seeds 1 and 2 (a mean over three seeds)
#   npz_subset / png       the first N training and M test images as an npz and as a folder of
#                          grayscale PNGs per class (Keras's class names): val_accuracy of each
#   jpeg_rgb               the same subset as RGB JPEGs (each image tinted by one of ten colors,
#                          by its index, not its class), resized to 32x32, training a [32, 32, 3]
#                          model
#   speed                  one worker, 600 steps: samples/s and the input wait per step from the
#                          IDX files and from the full training set as a PNG folder, alternated
#                          five times each (the median is what counts; run on a quiet machine)
#   big                    larger than memory: a stored npz of the training set six times over
#                          (270 MiB) trained by one worker (the Keras guide's MLP, 300 steps) in a
#                          memory cgroup of 96 MiB, which counts the worker's page cache too.
#                          Since issue 43 arrays are read into memory, never mapped, so this run
#                          shows the limit (the worker is out of memory) rather than training
# PARTS (default "accuracy speed") picks parts.
#   scripts/bench-data.sh [BUILD_DIR] [EPOCHS] [N] [M]      (defaults: build, 5, 12000, 2000)
# Needs /usr/bin/python3 with numpy and PIL (scripts/setup.sh --tests). Prints a table; asserts
# nothing but the data being written.
set -euo pipefail
cd "$(dirname "$0")/.."
build=${1:-build}
epochs=${2:-5}
train_n=${3:-12000}
test_n=${4:-2000}
bash scripts/build.sh "$build" >/dev/null
export PARTS=" ${PARTS:-accuracy speed} "
work=$(mktemp -d /tmp/dtrain-bench-data-XXXXXX)
trap 'rm -rf "$work"' EXIT
/usr/bin/python3 - "$work" "$build" "$epochs" "$train_n" "$test_n" <<'PY'
import gzip, hashlib, json, os, subprocess, sys, time
import numpy as np
from PIL import Image
work, build, epochs, train_n, test_n = sys.argv[1], sys.argv[2], *map(int, sys.argv[3:])
src = "/usr/share/datasets/fashion-mnist"
names = ["T-shirt_top", "Trouser", "Pullover", "Dress", "Coat", "Sandal", "Shirt", "Sneaker",
         "Bag", "Ankle_boot"]

def idx(name, offset):
    return np.frombuffer(gzip.open(f"{src}/{name}-ubyte.gz").read(), np.uint8, offset=offset)
x_train = idx("train-images-idx3", 16).reshape(-1, 28, 28)
y_train = idx("train-labels-idx1", 8)
x_test = idx("t10k-images-idx3", 16).reshape(-1, 28, 28)
y_test = idx("t10k-labels-idx1", 8)
np.savez(f"{work}/fashion.npz", x_train=x_train, y_train=y_train, x_test=x_test, y_test=y_test)
np.savez(f"{work}/subset.npz", x_train=x_train[:train_n], y_train=y_train[:train_n],
         x_test=x_test[:test_n], y_test=y_test[:test_n])
tints = [(255, 80, 80), (80, 255, 80), (80, 80, 255), (255, 255, 80), (255, 80, 255),
         (80, 255, 255), (200, 200, 200), (255, 160, 60), (160, 60, 255), (60, 160, 160)]
started = time.monotonic()
def folder(root, xs, ys, n, kind):
    for c in names:
        os.makedirs(f"{root}/{c}", exist_ok=True)
    for i in range(n):
        img = Image.fromarray(xs[i])
        if kind == "png":
            img.save(f"{root}/{names[ys[i]]}/{i:05d}.png")
        else:
            t = tints[i % len(tints)]
            rgb = Image.merge("RGB", [img.point(lambda v, k=k: v * k // 255) for k in t])
            rgb.save(f"{root}/{names[ys[i]]}/{i:05d}.jpg", quality=90)
parts = os.environ["PARTS"]
for kind in ("png", "jpeg") if " accuracy " in parts else ():
    folder(f"{work}/{kind}/train", x_train, y_train, train_n, kind)
    folder(f"{work}/{kind}/test", x_test, y_test, test_n, kind)
if " speed " in parts:
    folder(f"{work}/png_full/train", x_train, y_train, len(x_train), "png")
print(f"# data written in {time.monotonic() - started:.0f} s", flush=True)

base = json.load(open("configs/fashion-mnist-2workers.json"))
base.pop("cluster", None)
def run(name, data, workers=2, shape=(28, 28, 1), extra=None, seed=None):
    job = json.loads(json.dumps(base))
    job.update(job=name, workers=workers)
    t = job["train"]
    t.update(data=data, epochs=epochs, device="cpu", tensorboard=False,
             backup={"dir": "backup", "save_freq": "epoch", "keep": 1, "delete_on_success": True})
    t["model"]["input_shape"] = list(shape)
    t.update(extra or {})
    if seed is not None:
        t["seed"] = seed
    path = f"{work}/{name}.json"
    json.dump(job, open(path, "w"))
    out = f"{work}/runs/{name}"
    r = subprocess.run([f"{build}/launcher/dtrain", "launch", path, "--run-dir", out],
                       capture_output=True, text=True)
    if r.returncode != 0:
        sys.exit(f"{name} failed: {r.stderr[-2000:]}")
    lines = [json.loads(l) for l in open(f"{out}/metrics.jsonl") if l.strip()]
    digest = hashlib.sha256(open(f"{out}/model/model.safetensors", "rb").read()).hexdigest()
    return lines[-1], digest

print("run val_accuracy samples_per_s input_wait_ms_per_step model_sha256", flush=True)
def show(name, m, digest, steps=None):
    wait = m["input_wait_seconds"] / (steps or 1) * 1000 if steps else float("nan")
    print(f"{name} {m.get('val_accuracy', float('nan')):.4f} {m['samples_per_second']:.0f} "
          f"{wait:.3f} {digest[:16]}", flush=True)
for name, data in (() if " accuracy " not in parts else (("idx", {"source": "idx"}),
                   ("npz", {"source": "npz", "path": f"{work}/fashion.npz"}),
                   ("npz_file", {"source": "npz", "path": f"{work}/fashion.npz",
                                 "shard_policy": "file"}),
                   ("npz_subset", {"source": "npz", "path": f"{work}/subset.npz"}),
                   ("png", {"source": "directory", "train_dir": f"{work}/png/train",
                            "test_dir": f"{work}/png/test", "color_mode": "grayscale"}),
                   ("png_file", {"source": "directory", "train_dir": f"{work}/png/train",
                                 "test_dir": f"{work}/png/test", "color_mode": "grayscale",
                                 "shard_policy": "file"}))):
    show(name, *run(name, data))
for seed in (1, 2) if " accuracy " in parts else ():
    for name, policy in (("npz", "data"), ("npz_file", "file")):
        show(f"{name}_seed{seed}", *run(f"{name}_seed{seed}",
                                        {"source": "npz", "path": f"{work}/fashion.npz",
                                         "shard_policy": policy}, seed=seed))
if " accuracy " in parts:
    show("jpeg_rgb", *run("jpeg_rgb", {"source": "directory", "train_dir": f"{work}/jpeg/train",
                                       "test_dir": f"{work}/jpeg/test", "image_size": [32, 32]},
                          shape=(32, 32, 3)))
steps = 600
for repeat in range(5 if " speed " in parts else 0):
    for name, data in (("speed_idx", {"source": "idx"}),
                       ("speed_png", {"source": "directory",
                                      "train_dir": f"{work}/png_full/train",
                                      "color_mode": "grayscale"})):
        show(f"{name}_{repeat}", *run(f"{name}_{repeat}", data, workers=1,
                                      extra={"epochs": 1, "steps_per_epoch": steps,
                                             "validation": False}), steps)
# Larger than memory: a stored npz of the training set six times over, trained by one worker in
# a memory cgroup limited to less than the data (its page cache counts against the limit).
def memory_cgroup():
    v2 = "/sys/fs/cgroup/cgroup.subtree_control"
    if os.path.exists(v2) and "memory" in open(v2).read().split():
        return "/sys/fs/cgroup", "memory.max", "memory.peak"
    for line in open("/proc/self/cgroup"):
        _, controllers, path = line.strip().split(":", 2)
        if "memory" in controllers.split(","):
            base = f"/sys/fs/cgroup/memory{path}"
            if os.path.isdir(base):
                return base, "memory.limit_in_bytes", "memory.max_usage_in_bytes"
    return None, None, None
parent, limit_file, peak_file = memory_cgroup()
if " big " not in parts:
    sys.exit(0)
if parent is None or os.geteuid() != 0:
    print("# larger than memory: skipped (no writable memory cgroup)")
    sys.exit(0)
big = f"{work}/big.npz"
np.savez(big, x_train=np.concatenate([x_train] * 6), y_train=np.concatenate([y_train] * 6))
with open(big, "rb") as f:  # written and flushed: drop its pages, so the worker reads them in
    os.fsync(f.fileno())
    os.posix_fadvise(f.fileno(), 0, 0, os.POSIX_FADV_DONTNEED)
limit = 96 << 20
cgroup = f"{parent}/dtrain-bench-data-{os.getpid()}"
os.mkdir(cgroup)
try:
    open(f"{cgroup}/{limit_file}", "w").write(str(limit))
    job = json.loads(json.dumps(base["train"]))
    job["model"] = {"input_shape": [28, 28, 1], "layers": [
        {"type": "flatten"}, {"type": "dense", "units": 256, "activation": "relu"},
        {"type": "dense", "units": 256, "activation": "relu"}, {"type": "dense", "units": 10}]}
    job.update(data={"source": "npz", "path": big}, epochs=1, steps_per_epoch=300,
               validation=False, device="cpu", tensorboard=False,
               backup={"dir": "backup", "save_freq": "epoch", "keep": 1, "delete_on_success": True})
    json.dump(job, open(f"{work}/big.json", "w"))
    def join():
        open(f"{cgroup}/cgroup.procs", "w").write(str(os.getpid()))
    env = dict(os.environ, OMP_NUM_THREADS="2")
    env.pop("TF_CONFIG", None)
    started = time.monotonic()
    r = subprocess.run([f"{build}/worker/dtrain-worker", "--config", f"{work}/big.json",
                        "--run-dir", f"{work}/runs/big"], preexec_fn=join, env=env,
                       capture_output=True, text=True)
    peak = int(open(f"{cgroup}/{peak_file}").read())
    m = json.loads(open(f"{work}/runs/big/metrics.jsonl").readline()) if r.returncode == 0 else {}
    print(f"# larger than memory: {os.path.getsize(big) / 2**20:.0f} MiB npz, cgroup limit "
          f"{limit >> 20} MiB, peak {peak / 2**20:.0f} MiB, exit {r.returncode}, "
          f"{m.get('samples_per_second', 0):.0f} samples/s over 300 steps, "
          f"{time.monotonic() - started:.0f} s in all")
    if r.returncode != 0:
        print(r.stderr[-1500:])
finally:
    os.rmdir(cgroup)
PY
