#!/usr/bin/python3
"""Writes part of Fashion-MNIST as a folder of PNG files, one subfolder per class, the layout
Keras's image_dataset_from_directory (and dtrain's "source": "directory") reads:

    OUT/train/T-shirt_top/00000.png ... OUT/train/Ankle_boot/...   (the first TRAIN images)
    OUT/test/T-shirt_top/...                                       (the first TEST images)

    /usr/bin/python3 make_folder.py [TRAIN [TEST]] [--out fashion-mnist-png] [--idx-dir DIR]

Classes are named as Keras's Fashion-MNIST tutorial names them ('/' and ' ' made '_'). Reads
Debian's IDX files with the standard library alone (gzip, zlib, struct: no numpy, no PIL) and
writes 8-bit grayscale PNGs; downloads nothing.
"""
import argparse
import gzip
import os
import struct
import zlib

CLASS_NAMES = ["T-shirt_top", "Trouser", "Pullover", "Dress", "Coat",
               "Sandal", "Shirt", "Sneaker", "Bag", "Ankle_boot"]


def read_idx(path):
    """(shape, bytes) of an unsigned-byte IDX file, gzipped or not."""
    opener = gzip.open if path.endswith(".gz") else open
    with opener(path, "rb") as f:
        data = f.read()
    if data[0:2] != b"\0\0" or data[2] != 0x08:
        raise SystemExit(f"{path}: not an unsigned-byte IDX file")
    dims = data[3]
    shape = struct.unpack(f">{dims}I", data[4:4 + 4 * dims])
    return shape, data[4 + 4 * dims:]


def find(idx_dir, name):
    for candidate in (os.path.join(idx_dir, name), os.path.join(idx_dir, name + ".gz")):
        if os.path.exists(candidate):
            return candidate
    raise SystemExit(f"neither {name} nor {name}.gz in {idx_dir}")


def png_gray(width, height, pixels):
    """An 8-bit grayscale PNG of pixels (height rows of width bytes)."""
    def chunk(kind, body):
        return (struct.pack(">I", len(body)) + kind + body
                + struct.pack(">I", zlib.crc32(kind + body) & 0xffffffff))
    rows = b"".join(b"\0" + pixels[y * width:(y + 1) * width] for y in range(height))
    return (b"\x89PNG\r\n\x1a\n"
            + chunk(b"IHDR", struct.pack(">IIBBBBB", width, height, 8, 0, 0, 0, 0))
            + chunk(b"IDAT", zlib.compress(rows, 9)) + chunk(b"IEND", b""))


def write_split(idx_dir, prefix, count, out):
    (n, height, width), images = read_idx(find(idx_dir, f"{prefix}-images-idx3-ubyte"))
    _, labels = read_idx(find(idx_dir, f"{prefix}-labels-idx1-ubyte"))
    if count > n:
        raise SystemExit(f"{prefix}: asked for {count} images, the IDX file has {n}")
    for name in CLASS_NAMES:
        os.makedirs(os.path.join(out, name), exist_ok=True)
    size = height * width
    for i in range(count):
        path = os.path.join(out, CLASS_NAMES[labels[i]], f"{i:05d}.png")
        with open(path, "wb") as f:
            f.write(png_gray(width, height, images[i * size:(i + 1) * size]))
    print(f"{out}: {count} images of {height}x{width} in {len(CLASS_NAMES)} class folders")


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("train", nargs="?", type=int, default=6000, help="training images (6000)")
    parser.add_argument("test", nargs="?", type=int, default=1000, help="test images (1000)")
    parser.add_argument("--out", default="fashion-mnist-png")
    parser.add_argument("--idx-dir", default="/usr/share/datasets/fashion-mnist")
    args = parser.parse_args()
    write_split(args.idx_dir, "train", args.train, os.path.join(args.out, "train"))
    write_split(args.idx_dir, "t10k", args.test, os.path.join(args.out, "test"))


if __name__ == "__main__":
    main()
