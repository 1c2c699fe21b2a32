#!/usr/bin/env bash
# Users' own data (issue 27), side by side in one run, two workers on this machine, the main
# job's CNN and recipe:
#   idx / npz / npz_file   Fashion-MNIST from Debian's IDX files, the same as Keras's npz
#                          (np.savez from the IDX files), and that npz sharded by file: the
#                          models' SHA-256 and val_accuracy (npz must equal idx bit for bit)
#   npz_subset / png       the first N training and M test images as an npz and as a folder of
#                          grayscale PNGs per class (Keras's class names): val_accuracy of each
#   jpeg_rgb               the same subset as RGB JPEGs (a color per class tint), resized to
#                          32x32, training a [32, 32, 3] model
#   speed                  one worker, 200 steps: samples/s and the input wait per step from the
#                          IDX files and from the full training set as a PNG folder
#   scripts/bench-data.sh [BUILD_DIR] [EPOCHS] [N] [M]      (defaults: build, 3, 12000, 2000)
# Needs /usr/bin/python3 with numpy and PIL (scripts/setup.sh --tests). Prints a table; asserts
# nothing but the data being written.
set -euo pipefail
cd "$(dirname "$0")/.."
build=${1:-build}
epochs=${2:-3}
train_n=${3:-12000}
test_n=${4:-2000}
bash scripts/build.sh "$build" >/dev/null
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
            t = tints[ys[i]]
            rgb = Image.merge("RGB", [img.point(lambda v, k=k: v * k // 255) for k in t])
            rgb.save(f"{root}/{names[ys[i]]}/{i:05d}.jpg", quality=90)
for kind in ("png", "jpeg"):
    folder(f"{work}/{kind}/train", x_train, y_train, train_n, kind)
    folder(f"{work}/{kind}/test", x_test, y_test, test_n, kind)
folder(f"{work}/png_full/train", x_train, y_train, len(x_train), "png")
print(f"# data written in {time.monotonic() - started:.0f} s", flush=True)

base = json.load(open("configs/fashion-mnist-2workers.json"))
del base["cluster"]
def run(name, data, workers=2, shape=(28, 28, 1), extra=None):
    job = json.loads(json.dumps(base))
    job.update(job=name, workers=workers)
    t = job["train"]
    t.update(data=data, epochs=epochs, device="cpu", tensorboard=False,
             backup={"dir": "backup", "save_freq": "epoch", "keep": 1, "delete_on_success": True})
    t["model"]["input_shape"] = list(shape)
    t.update(extra or {})
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
for name, data in (("idx", {"source": "idx"}),
                   ("npz", {"source": "npz", "path": f"{work}/fashion.npz"}),
                   ("npz_file", {"source": "npz", "path": f"{work}/fashion.npz",
                                 "shard_policy": "file"}),
                   ("npz_subset", {"source": "npz", "path": f"{work}/subset.npz"}),
                   ("png", {"source": "directory", "train_dir": f"{work}/png/train",
                            "test_dir": f"{work}/png/test", "color_mode": "grayscale"}),
                   ("png_file", {"source": "directory", "train_dir": f"{work}/png/train",
                                 "test_dir": f"{work}/png/test", "color_mode": "grayscale",
                                 "shard_policy": "file"})):
    show(name, *run(name, data))
show("jpeg_rgb", *run("jpeg_rgb", {"source": "directory", "train_dir": f"{work}/jpeg/train",
                                   "test_dir": f"{work}/jpeg/test", "image_size": [32, 32]},
                      shape=(32, 32, 3)))
steps = 200
for name, data in (("speed_idx", {"source": "idx"}),
                   ("speed_png", {"source": "directory", "train_dir": f"{work}/png_full/train",
                                  "color_mode": "grayscale"}),
                   ("speed_idx_again", {"source": "idx"})):
    show(name, *run(name, data, workers=1,
                    extra={"epochs": 1, "steps_per_epoch": steps, "validation": False}), steps)
PY
