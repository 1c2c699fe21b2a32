#!/usr/bin/env python3
"""Reads a Keras 3 .keras archive and prints what it holds as JSON, for test_keras_archive.

Written from Keras's saving_lib layout, not from dtrain's writer: a zip of metadata.json,
config.json and model.weights.h5, whose HDF5 groups are `vars` (the model's own) and
`layers/<name>/vars` (each layer's variables as datasets "0", "1", ..., and the layer's name
as the group's "name" attribute). With --inputs FILE (float32, channels last, shaped as the
model's input), it also runs the model forward in numpy, channels last as Keras does, from
config.json and the archive's weights, each layer's found by its "name" attribute: conv,
batch normalization at inference, add, relu, pooling, flatten, dense. Needs python3-numpy and
python3-h5py. With --values, also each dataset's values, flattened, by path. Usage:
read_keras_archive.py MODEL.keras [--inputs FILE] [--values]. Exits 1 naming what is
wrong (a bad CRC, a member missing, a layer without weights, a class it cannot run).
"""
import argparse
import io
import json
import sys
import zipfile

import h5py
import numpy as np


class ArchiveError(Exception):
    pass


def h5_tree(f):
    """Every group and dataset below the root as one line each, sorted: 'group PATH
    name=VALUE' (its attributes) or 'dataset PATH [shape] dtype'."""
    lines = []

    def visit(path, obj):
        if isinstance(obj, h5py.Dataset):
            shape = ",".join(str(s) for s in obj.shape)
            lines.append(f"dataset {path} [{shape}] {obj.dtype.str}")
        else:
            attrs = " ".join(f"{k}={decode(v)}" for k, v in sorted(obj.attrs.items()))
            lines.append(f"group {path}" + (f" {attrs}" if attrs else ""))

    f.visititems(visit)
    attrs = " ".join(f"{k}={decode(v)}" for k, v in sorted(f.attrs.items()))
    return sorted(lines) + ([f"root {attrs}"] if attrs else [])


def decode(value):
    return value.decode("utf-8") if isinstance(value, bytes) else str(value)


def layer_weights(f):
    """{layer name: [arrays in order]} from every layers/*/vars group's "name" attribute."""
    weights = {}
    for group in f["layers"].values():
        variables = group["vars"]
        name = decode(variables.attrs["name"])
        keys = sorted(variables.keys(), key=int)
        if keys != [str(i) for i in range(len(keys))]:
            raise ArchiveError(f"layer {name}: variables {keys} are not 0, 1, ...")
        weights[name] = [np.array(variables[k], dtype=np.float64) for k in keys]
    return weights


# --- the forward pass, channels last ----------------------------------------------------------


def same_padding(size, kernel, stride):
    out = (size + stride - 1) // stride
    total = max((out - 1) * stride + kernel - size, 0)
    return total // 2, total - total // 2


def activation(name, x):
    if name in (None, "linear"):
        return x
    if name == "relu":
        return np.maximum(x, 0)
    if name == "softmax":
        e = np.exp(x - x.max(axis=-1, keepdims=True))
        return e / e.sum(axis=-1, keepdims=True)
    raise ArchiveError(f"activation {name!r}")


def conv2d(c, w, x):
    kernel = w[0]
    kh, kw, _, filters = kernel.shape
    sh, sw = c["strides"]
    if c["padding"] == "same":
        top, bottom = same_padding(x.shape[1], kh, sh)
        left, right = same_padding(x.shape[2], kw, sw)
        x = np.pad(x, ((0, 0), (top, bottom), (left, right), (0, 0)))
    oh, ow = (x.shape[1] - kh) // sh + 1, (x.shape[2] - kw) // sw + 1
    y = np.zeros((x.shape[0], oh, ow, filters))
    for i in range(kh):
        for j in range(kw):
            patch = x[:, i:i + sh * (oh - 1) + 1:sh, j:j + sw * (ow - 1) + 1:sw, :]
            y += np.einsum("nhwc,co->nhwo", patch, kernel[i, j])
    return y + w[1] if c["use_bias"] else y


def max_pooling2d(c, x):
    ph, pw = c["pool_size"]
    sh, sw = c["strides"] or c["pool_size"]
    if c["padding"] != "valid":
        raise ArchiveError("MaxPooling2D with padding other than valid")
    oh, ow = (x.shape[1] - ph) // sh + 1, (x.shape[2] - pw) // sw + 1
    y = np.full((x.shape[0], oh, ow, x.shape[3]), -np.inf)
    for i in range(ph):
        for j in range(pw):
            y = np.maximum(y, x[:, i:i + sh * (oh - 1) + 1:sh, j:j + sw * (ow - 1) + 1:sw, :])
    return y


def batch_normalization(c, w, x):
    w = list(w)
    gamma = w.pop(0) if c["scale"] else 1.0
    beta = w.pop(0) if c["center"] else 0.0
    mean, variance = w
    return (x - mean) / np.sqrt(variance + c["epsilon"]) * gamma + beta


def run_layer(class_name, c, w, xs):
    """(pre-activation output, output) of one layer on its inputs xs."""
    x = xs[0]
    if class_name == "Conv2D":
        y = conv2d(c, w, x)
    elif class_name == "Dense":
        y = x @ w[0] + (w[1] if c["use_bias"] else 0)
    elif class_name == "MaxPooling2D":
        y = max_pooling2d(c, x)
    elif class_name == "Flatten":
        y = x.reshape(x.shape[0], -1)  # channels last: (h, w, c) order
    elif class_name in ("Dropout", "RandomFlip"):
        y = x
    elif class_name == "ReLU":
        y = np.maximum(x, 0)
    elif class_name == "Add":
        y = sum(xs[1:], xs[0])
    elif class_name == "Concatenate":
        y = np.concatenate(xs, axis=-1)
    elif class_name == "BatchNormalization":
        y = batch_normalization(c, w, x)
    elif class_name == "GlobalAveragePooling2D":
        y = x.mean(axis=(1, 2))
    elif class_name == "ZeroPadding2D":
        (top, bottom), (left, right) = c["padding"]
        y = np.pad(x, ((0, 0), (top, bottom), (left, right), (0, 0)))
    elif class_name == "Activation":
        return x, activation(c["activation"], x)
    else:
        raise ArchiveError(f"the class {class_name} is not run here")
    return y, activation(c.get("activation"), y)


def graph(model):
    """The model's layers as (name, class, config, input names), its input's name and shape,
    and its output's name."""
    c = model["config"]
    if model["class_name"] == "Sequential":
        entries = c["layers"]
        first = entries[0]
        shape = first["config"]["batch_shape"] if first["class_name"] == "InputLayer" else \
            c["build_input_shape"]
        layers, before = [], "input"
        for e in entries:
            if e["class_name"] == "InputLayer":
                continue
            layers.append((e["config"]["name"], e["class_name"], e["config"], [before]))
            before = e["config"]["name"]
        return layers, "input", shape, before
    layers, source = [], None
    for e in c["layers"]:
        if e["class_name"] == "InputLayer":
            source, shape = e["name"], e["config"]["batch_shape"]
            continue
        arg = e["inbound_nodes"][0]["args"][0]
        tensors = arg if isinstance(arg, list) else [arg]
        inputs = [t["config"]["keras_history"][0] for t in tensors]
        layers.append((e["name"], e["class_name"], e["config"], inputs))
    return layers, source, shape, c["output_layers"][0]


def forward(model, weights, images):
    """(logits, outputs): the output layer's pre-activation values and its outputs."""
    layers, source, shape, output = graph(model)
    if list(images.shape[1:]) != list(shape[1:]):
        raise ArchiveError(f"inputs of shape {images.shape[1:]}, the model takes {shape[1:]}")
    values, logits = {source: images.astype(np.float64)}, None
    pending = list(layers)
    while pending:
        ready = [layer for layer in pending if all(i in values for i in layer[3])]
        if not ready:
            raise ArchiveError("the layers do not form a graph from the input")
        for name, class_name, c, inputs in ready:
            if name not in weights:
                raise ArchiveError(f"layer {name}: no layers/*/vars group names it")
            pre, values[name] = run_layer(class_name, c, weights[name],
                                          [values[i] for i in inputs])
            if name == output:
                logits = pre
            pending.remove((name, class_name, c, inputs))
    return logits, values[output]


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("archive")
    parser.add_argument("--inputs")
    parser.add_argument("--values", action="store_true",
                        help="also every dataset's values, flattened, by its path")
    args = parser.parse_args()
    try:
        with zipfile.ZipFile(args.archive) as z:
            bad = z.testzip()
            if bad is not None:
                raise ArchiveError(f"{bad}: CRC mismatch")
            members = [{"name": i.filename, "compress_type": i.compress_type,
                        "size": i.file_size} for i in z.infolist()]
            metadata = json.loads(z.read("metadata.json"))
            config = json.loads(z.read("config.json"))
            h5 = h5py.File(io.BytesIO(z.read("model.weights.h5")), "r")
        out = {"members": members, "metadata": metadata, "config": config, "h5": h5_tree(h5)}
        if args.values:
            out["values"] = {}
            h5.visititems(lambda path, obj: out["values"].__setitem__(
                path, np.array(obj).ravel().tolist()) if isinstance(obj, h5py.Dataset) else None)
        if args.inputs:
            shape = graph(config)[2]
            images = np.fromfile(args.inputs, dtype="<f4").reshape([-1] + list(shape[1:]))
            logits, outputs = forward(config, layer_weights(h5), images)
            out["logits"], out["outputs"] = logits.tolist(), outputs.tolist()
    except (ArchiveError, OSError, KeyError, zipfile.BadZipFile) as e:
        print(f"{args.archive}: {e}", file=sys.stderr)
        return 1
    json.dump(out, sys.stdout)
    return 0


if __name__ == "__main__":
    sys.exit(main())
