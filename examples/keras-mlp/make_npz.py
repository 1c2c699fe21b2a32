#!/usr/bin/python3
"""Writes Fashion-MNIST as the .npz archive Keras users keep: np.savez(path, x_train=...,
y_train=..., x_test=..., y_test=...), images (N, 28, 28) and labels (N,), all uint8, as
keras.datasets.fashion_mnist.load_data() returns them. Reads Debian's IDX files; downloads nothing.

    /usr/bin/python3 make_npz.py [--idx-dir DIR] [--out fashion-mnist.npz]
"""
import argparse
import gzip
import os

import numpy as np  # Debian: apt-get install python3-numpy


def read_idx(path):
    """An IDX file (.gz or not) as a uint8 array of the shape its header gives."""
    opener = gzip.open if path.endswith(".gz") else open
    with opener(path, "rb") as f:
        data = f.read()
    if data[0:2] != b"\0\0" or data[2] != 0x08:
        raise SystemExit(f"{path}: not an unsigned-byte IDX file")
    dims = data[3]
    shape = tuple(int.from_bytes(data[4 + 4 * i: 8 + 4 * i], "big") for i in range(dims))
    array = np.frombuffer(data, dtype=np.uint8, offset=4 + 4 * dims)
    if array.size != int(np.prod(shape)):
        raise SystemExit(f"{path}: header promises {shape}, file holds {array.size} bytes")
    return array.reshape(shape)


def find(idx_dir, name):
    for candidate in (os.path.join(idx_dir, name), os.path.join(idx_dir, name + ".gz")):
        if os.path.exists(candidate):
            return candidate
    raise SystemExit(f"neither {name} nor {name}.gz in {idx_dir}")


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--idx-dir", default="/usr/share/datasets/fashion-mnist")
    parser.add_argument("--out", default="fashion-mnist.npz")
    args = parser.parse_args()
    arrays = {
        "x_train": read_idx(find(args.idx_dir, "train-images-idx3-ubyte")),
        "y_train": read_idx(find(args.idx_dir, "train-labels-idx1-ubyte")),
        "x_test": read_idx(find(args.idx_dir, "t10k-images-idx3-ubyte")),
        "y_test": read_idx(find(args.idx_dir, "t10k-labels-idx1-ubyte")),
    }
    np.savez(args.out, **arrays)
    print(f"{args.out}: " + ", ".join(f"{k} {v.shape} {v.dtype}" for k, v in arrays.items()))


if __name__ == "__main__":
    main()
