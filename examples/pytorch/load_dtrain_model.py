#!/usr/bin/env python3
"""Loads the final model of a dtrain run into PyTorch and evaluates it on the test split.

    load_dtrain_model.py RUN_DIR [--data DIR] [--json]

Reads RUN_DIR/model/model.json (the job's `train.model`) and RUN_DIR/model/model.safetensors
(parsed here with struct, json and numpy: Debian has no `safetensors` package), builds the same
architecture as a torch.nn.Sequential, and evaluates it on the whole IDX test split, with
pixels scaled as dtrain scales them (byte / 255). Tensor layouts and their Keras mapping are in
docs/model-format.md. It does not train, and does not read checkpoints' optimizer slots.
A missing or damaged file, or a layer it does not know, ends it with exit code 2.
"""
import argparse
import gzip
import json
import math
import os
import struct
import sys
import zlib

import numpy as np

DEFAULT_DATA_DIR = "/usr/share/datasets/fashion-mnist"
MAX_HEADER_BYTES = 100 << 20  # dtrain's limit and the safetensors package's


class ModelError(Exception):
    """A file is missing or not what dtrain writes, or the model has a layer this cannot build."""


# --- safetensors -----------------------------------------------------------------------------


def read_safetensors(path):
    """{name: float32 numpy array} and the __metadata__ map of a dtrain safetensors file.

    Checks what dtrain's own reader checks: the header's sizes against the file, F32 only, and
    the "checksum" metadata (CRC-32 of "key=value\\n" for every other metadata key, sorted,
    then of the data section)."""
    try:
        with open(path, "rb") as f:
            blob = f.read()
    except OSError as e:
        raise ModelError(f"{path}: cannot read: {e.strerror}") from None
    if len(blob) < 8:
        raise ModelError(f"{path}: truncated: {len(blob)} bytes, not even the 8-byte header length")
    (header_len,) = struct.unpack("<Q", blob[:8])
    if header_len > MAX_HEADER_BYTES or 8 + header_len > len(blob):
        raise ModelError(f"{path}: truncated or not safetensors: header of {header_len} bytes, "
                         f"file of {len(blob)}")
    try:
        header = json.loads(blob[8:8 + header_len].decode("utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as e:
        raise ModelError(f"{path}: the header is not JSON: {e}") from None
    if not isinstance(header, dict):
        raise ModelError(f"{path}: the header is not a JSON object")
    metadata = header.pop("__metadata__", {}) or {}
    if not isinstance(metadata, dict) or not all(isinstance(v, str) for v in metadata.values()):
        raise ModelError(f"{path}: __metadata__ is not an object of strings")
    data = memoryview(blob)[8 + header_len:]
    tensors, end = {}, 0
    for name, entry in header.items():
        try:
            dtype, shape, (begin, stop) = entry["dtype"], entry["shape"], entry["data_offsets"]
            if not all(isinstance(v, int) and v >= 0 for v in [*shape, begin, stop]):
                raise ValueError
        except (TypeError, KeyError, ValueError):
            raise ModelError(f"{path}: tensor {name}: not a safetensors entry: {entry}") from None
        if dtype != "F32":
            raise ModelError(f"{path}: tensor {name} is {dtype}; dtrain writes F32 only")
        count = math.prod(shape)  # exact: np.prod wraps round on [2**32, 2**32]
        if not 0 <= begin <= stop or stop - begin != 4 * count:
            raise ModelError(f"{path}: tensor {name}: offsets [{begin}, {stop}] do not hold "
                             f"shape {shape}")
        if stop > len(data):
            raise ModelError(f"{path}: truncated: tensor {name} ends at data byte {stop}, the "
                             f"file has {len(data)} data bytes")
        tensors[name] = np.frombuffer(data[begin:stop], dtype="<f4").reshape(shape)
        end = max(end, stop)
    if end != len(data):
        raise ModelError(f"{path}: {len(data) - end} bytes after the last tensor")
    check_checksum(path, metadata, data)
    return tensors, metadata


def check_checksum(path, metadata, data):
    expected = metadata.get("checksum")
    if expected is None:
        return
    crc = 0
    for key in sorted(k for k in metadata if k != "checksum"):
        crc = zlib.crc32(f"{key}={metadata[key]}\n".encode("utf-8"), crc)
    crc = zlib.crc32(data, crc)
    if expected != f"crc32:{crc:08x}":
        raise ModelError(f"{path}: checksum mismatch (header says {expected}, data gives "
                         f"crc32:{crc:08x}): the file is damaged")


# --- the model -------------------------------------------------------------------------------


def pair(value, what):
    """Keras's int-or-pair sizes and strides."""
    if isinstance(value, int):
        return value, value
    if isinstance(value, list) and len(value) == 2 and all(isinstance(v, int) for v in value):
        return tuple(value)
    raise ModelError(f"{what}: expected an integer or a pair, found {value!r}")


def same_padding(size, kernel, stride):
    """Keras/TensorFlow "same": (before, after), the odd pixel after (bottom/right)."""
    out = (size + stride - 1) // stride
    total = max((out - 1) * stride + kernel - size, 0)
    return total // 2, total - total // 2


class Builder:
    """Turns model.json's layers into torch modules, tracking the (c, h, w) of one example."""

    def __init__(self, nn, spec, tensors, path):
        self.nn, self.tensors, self.path = nn, dict(tensors), path
        h, w, c = spec["input_shape"]
        self.dims = (c, h, w)
        self.modules = []
        self.softmax = False

    def take(self, name, shape):
        """The tensor dtrain stores as name, checked against the shape the layer needs."""
        if name not in self.tensors:
            raise ModelError(f"{self.path}: has no tensor {name} (shape {list(shape)})")
        t = self.tensors.pop(name)
        if tuple(t.shape) != tuple(shape):
            raise ModelError(f"{self.path}: tensor {name} has shape {list(t.shape)}, the model "
                             f"needs {list(shape)}")
        return t

    def keys(self, i, layer, allowed):
        extra = set(layer) - set(allowed)
        if extra:
            raise ModelError(f"model.layers[{i}]: unsupported key(s) {sorted(extra)}")

    def conv2d(self, i, layer):
        import torch
        self.keys(i, layer, {"type", "filters", "kernel_size", "strides", "padding",
                             "activation", "use_bias"})
        if layer.get("use_bias", True) is not True:
            raise ModelError(f"model.layers[{i}]: use_bias false is not supported")
        c, h, w = self.dims
        k = layer["filters"]
        kh, kw = pair(layer["kernel_size"], f"model.layers[{i}].kernel_size")
        sh, sw = pair(layer.get("strides", 1), f"model.layers[{i}].strides")
        padding = layer.get("padding", "valid")
        if padding == "same":
            (top, bottom), (left, right) = same_padding(h, kh, sh), same_padding(w, kw, sw)
            if top or bottom or left or right:  # explicit: torch's "same" pads the other side
                self.modules.append(self.nn.ZeroPad2d((left, right, top, bottom)))
            h, w = h + top + bottom, w + left + right
        elif padding != "valid":
            raise ModelError(f"model.layers[{i}].padding: unsupported {padding!r}")
        conv = self.nn.Conv2d(c, k, (kh, kw), stride=(sh, sw))
        with torch.no_grad():  # dtrain's kernel is [out, in, kh, kw]: Conv2d's layout as it is
            conv.weight.copy_(torch.from_numpy(self.take(f"layers.{i}.conv2d.kernel",
                                                         (k, c, kh, kw)).copy()))
            conv.bias.copy_(torch.from_numpy(self.take(f"layers.{i}.conv2d.bias", (k,)).copy()))
        self.modules.append(conv)
        self.dims = (k, (h - kh) // sh + 1, (w - kw) // sw + 1)
        self.activation(i, layer)

    def dense(self, i, layer):
        import torch
        self.keys(i, layer, {"type", "units", "activation", "use_bias"})
        if layer.get("use_bias", True) is not True:
            raise ModelError(f"model.layers[{i}]: use_bias false is not supported")
        c, h, w = self.dims
        if h != 1 or w != 1:
            raise ModelError(f"model.layers[{i}]: dense needs flat input ({h}x{w}x{c})")
        units = layer["units"]
        linear = self.nn.Linear(c, units)
        with torch.no_grad():  # dtrain's kernel is [in, out] (Keras's); Linear.weight is [out, in]
            kernel = self.take(f"layers.{i}.dense.kernel", (c, units))
            linear.weight.copy_(torch.from_numpy(np.ascontiguousarray(kernel.T)))
            bias = self.take(f"layers.{i}.dense.bias", (units,))
            linear.bias.copy_(torch.from_numpy(bias.copy()))
        self.modules.append(linear)
        self.dims = (units, 1, 1)
        self.activation(i, layer)

    def max_pooling2d(self, i, layer):
        self.keys(i, layer, {"type", "pool_size", "strides", "padding"})
        if layer.get("padding", "valid") != "valid":
            raise ModelError(f"model.layers[{i}].padding: only \"valid\" pooling is supported")
        c, h, w = self.dims
        ph, pw = pair(layer.get("pool_size", 2), f"model.layers[{i}].pool_size")
        strides = layer.get("strides")  # Keras: strides default to pool_size
        sh, sw = (ph, pw) if strides is None else pair(strides, f"model.layers[{i}].strides")
        self.modules.append(self.nn.MaxPool2d((ph, pw), stride=(sh, sw)))
        self.dims = (c, (h - ph) // sh + 1, (w - pw) // sw + 1)

    def flatten(self, i, layer):
        self.keys(i, layer, {"type"})
        self.modules.append(self.nn.Flatten())  # dtrain's activations are NCHW: (c, h, w) order
        c, h, w = self.dims
        self.dims = (c * h * w, 1, 1)

    def dropout(self, i, layer):
        self.keys(i, layer, {"type", "rate"})
        self.modules.append(self.nn.Dropout(layer["rate"]))  # identity in eval()

    def relu(self, i, layer):
        self.keys(i, layer, {"type"})
        self.modules.append(self.nn.ReLU())

    def activation(self, i, layer):
        name = layer.get("activation") or "linear"
        if name == "relu":
            self.modules.append(self.nn.ReLU())
        elif name == "softmax":
            self.modules.append(self.nn.Softmax(dim=1))
            self.softmax = True
        elif name != "linear":
            raise ModelError(f"model.layers[{i}].activation: unsupported {name!r}")


def build_model(spec, tensors, path):
    """torch.nn.Sequential of model.json's spec with the weights in tensors (eval mode), and
    whether its last module is a softmax (evaluate drops it to get logits)."""
    import torch.nn as nn
    try:
        builder = Builder(nn, spec, tensors, path)
        for i, layer in enumerate(spec["layers"]):
            kind = layer.get("type")
            if kind not in ("conv2d", "dense", "max_pooling2d", "flatten", "dropout", "relu"):
                raise ModelError(f"model.layers[{i}]: unsupported layer type {kind!r}")
            if builder.softmax:
                raise ModelError(f"model.layers[{i}]: softmax is only supported last")
            getattr(builder, kind)(i, layer)
    except (AttributeError, KeyError, TypeError, ValueError) as e:
        raise ModelError(f"model.json: not a dtrain model ({type(e).__name__}: {e})") from None
    if builder.tensors:
        raise ModelError(f"{path}: tensors the model does not use: {sorted(builder.tensors)}")
    return nn.Sequential(*builder.modules).eval(), builder.softmax


def load_model(run_dir):
    """(model, input_shape [h, w, c], ends_with_softmax) of RUN_DIR/model."""
    model_dir = os.path.join(run_dir, "model")
    spec_path = os.path.join(model_dir, "model.json")
    try:
        with open(spec_path, encoding="utf-8") as f:
            spec = json.load(f)
    except OSError as e:
        raise ModelError(f"{spec_path}: cannot read: {e.strerror}") from None
    except (UnicodeDecodeError, json.JSONDecodeError) as e:
        raise ModelError(f"{spec_path}: not JSON: {e}") from None
    weights_path = os.path.join(model_dir, "model.safetensors")
    tensors, metadata = read_safetensors(weights_path)
    if "architecture" in metadata:
        try:
            architecture = json.loads(metadata["architecture"])
        except json.JSONDecodeError as e:
            raise ModelError(f"{weights_path}: its architecture is not JSON: {e}") from None
        # model.json may begin with the run's dtype_policy and class_names, which the weights'
        # metadata keeps apart; the weights are fp32 whatever the policy.
        plain = {k: v for k, v in spec.items() if k not in ("dtype_policy", "class_names")} \
            if isinstance(spec, dict) else spec
        if architecture != plain:
            raise ModelError(f"{weights_path}: its architecture differs from {spec_path}")
        if isinstance(spec, dict) and spec.get("dtype_policy", "float32") != metadata.get(
                "dtype_policy", "float32"):
            raise ModelError(f"{weights_path}: its dtype_policy differs from {spec_path}")
    if not isinstance(spec, dict) or "input_shape" not in spec or "layers" not in spec:
        raise ModelError(f"{spec_path}: expected {{\"input_shape\": ..., \"layers\": ...}}")
    model, softmax = build_model(spec, tensors, weights_path)
    return model, spec["input_shape"], softmax


# --- the test split --------------------------------------------------------------------------


def read_idx(path, magic):
    """The array of an IDX file of unsigned bytes (gzip'ed or not, told by its first bytes)."""
    try:
        with open(path, "rb") as f:
            raw = f.read()
        if raw[:2] == b"\x1f\x8b":
            raw = gzip.decompress(raw)
    except (OSError, EOFError, zlib.error) as e:
        raise ModelError(f"{path}: cannot read: {e}") from None
    if len(raw) < 4 or struct.unpack(">I", raw[:4])[0] != magic:
        raise ModelError(f"{path}: not an IDX file of magic 0x{magic:08x}")
    rank = magic & 0xFF
    if len(raw) < 4 + 4 * rank:
        raise ModelError(f"{path}: truncated IDX header")
    shape = struct.unpack(f">{rank}I", raw[4:4 + 4 * rank])
    count = math.prod(shape)
    if len(raw) != 4 + 4 * rank + count:
        raise ModelError(f"{path}: {len(raw) - 4 - 4 * rank} data bytes, dims {list(shape)} "
                         f"need {count}")
    return np.frombuffer(raw, dtype=np.uint8, offset=4 + 4 * rank).reshape(shape)


def idx_path(directory, name):
    """dtrain's rule: DIR/name if it exists, else DIR/name.gz."""
    for candidate in (os.path.join(directory, name), os.path.join(directory, name + ".gz")):
        if os.path.exists(candidate):
            return candidate
    raise ModelError(f"{directory}: has neither {name} nor {name}.gz")


def test_split_paths(run_dir, data_dir):
    """(images, labels) paths: from --data, else the run's spec.json `train.data`, else the
    default folder."""
    images = labels = None
    if data_dir is None:
        try:
            with open(os.path.join(run_dir, "spec.json"), encoding="utf-8") as f:
                data = json.load(f).get("train", {}).get("data", {})
        except (OSError, ValueError, AttributeError):
            data = {}
        if data.get("source", "idx") != "idx":
            raise ModelError(f"{run_dir}/spec.json: data source {data['source']!r} has no IDX "
                             f"test split; pass --data DIR")
        data_dir = data.get("dir", DEFAULT_DATA_DIR)
        images, labels = data.get("test_images"), data.get("test_labels")
    return (images or idx_path(data_dir, "t10k-images-idx3-ubyte"),
            labels or idx_path(data_dir, "t10k-labels-idx1-ubyte"))


def load_test_split(run_dir, data_dir, input_shape):
    """NCHW float32 images in [0, 1] (byte / 255, as dtrain) and int64 labels."""
    images_path, labels_path = test_split_paths(run_dir, data_dir)
    images = read_idx(images_path, 0x00000803)
    labels = read_idx(labels_path, 0x00000801)
    if len(images) != len(labels):
        raise ModelError(f"{images_path} has {len(images)} images, {labels_path} "
                         f"{len(labels)} labels")
    h, w, c = input_shape
    if images.shape[1:] != (h, w) or c != 1:
        raise ModelError(f"{images_path}: images are {images.shape[1]}x{images.shape[2]}x1 but "
                         f"model.input_shape is {list(input_shape)}")
    x = images.astype(np.float32) / np.float32(255.0)
    return x.reshape(len(images), 1, h, w), labels.astype(np.int64)


# --- evaluation ------------------------------------------------------------------------------


def with_onednn_linear(model):
    """The model with each nn.Linear run by oneDNN (dense tensors in and out, the same math):
    Debian's torch multiplies with the reference BLAS, 20 times slower on the tutorial CNN."""
    import torch
    if not torch.backends.mkldnn.is_available():
        return model
    from torch.utils.mkldnn import MkldnnLinear
    return torch.nn.Sequential(*[MkldnnLinear(m, torch.float)
                                 if isinstance(m, torch.nn.Linear) else m for m in model])


def evaluate(model, softmax, images, labels, batch=1000):
    """Mean cross-entropy of the logits and accuracy (first maximum wins, as in dtrain)."""
    import torch
    import torch.nn.functional as F
    logits_model = with_onednn_linear(model[:-1] if softmax else model)
    loss, correct = 0.0, 0
    with torch.no_grad():
        for start in range(0, len(images), batch):
            x = torch.from_numpy(images[start:start + batch])
            y = torch.from_numpy(labels[start:start + batch])
            logits = logits_model(x)
            loss += F.cross_entropy(logits.double(), y, reduction="sum").item()
            correct += int((logits.argmax(dim=1) == y).sum())
    n = max(len(images), 1)
    return {"accuracy": correct / n, "loss": loss / n, "examples": len(images)}


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("run_dir", metavar="RUN_DIR", help="a dtrain run folder (has model/)")
    parser.add_argument("--data", metavar="DIR",
                        help="folder of t10k-images-idx3-ubyte[.gz] and t10k-labels-idx1-ubyte"
                             "[.gz] (default: the run's train.data, else " + DEFAULT_DATA_DIR + ")")
    parser.add_argument("--json", action="store_true",
                        help='print {"accuracy": ..., "loss": ..., "examples": ...} only')
    args = parser.parse_args()
    try:
        import torch  # noqa: F401 (only to fail early, with a hint)
    except ImportError as e:
        sys.exit(f"load_dtrain_model: needs PyTorch ({e}); on Debian: apt install python3-torch")
    try:
        model, input_shape, softmax = load_model(args.run_dir)
        images, labels = load_test_split(args.run_dir, args.data, input_shape)
    except ModelError as e:
        print(f"load_dtrain_model: error: {e}", file=sys.stderr)
        sys.exit(2)
    result = evaluate(model, softmax, images, labels)
    if args.json:
        print(json.dumps(result))
        return
    print(model)
    print(f"test split: {result['examples']} examples, loss {result['loss']:.4f}, "
          f"accuracy {result['accuracy']:.4f}")


if __name__ == "__main__":
    main()
