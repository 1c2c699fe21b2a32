#!/usr/bin/env python3
"""Loads the final model of a dtrain run into PyTorch and evaluates it on the test split.

    load_dtrain_model.py RUN_DIR [--data DIR] [--json]

Reads RUN_DIR/model/model.json (the job's `train.model`) and RUN_DIR/model/model.safetensors
(parsed here with struct, json and numpy: Debian has no `safetensors` package), builds the same
architecture (a torch.nn.Sequential for a chain of layers, a GraphModel for a graph: named
inputs, residual adds, fan-out, layers listed in any order), and evaluates it on the whole IDX
test split, with pixels scaled as dtrain scales them (byte / 255). Tensor layouts and their
Keras mapping are in docs/model-format.md. It does not train, and does not read checkpoints'
optimizer slots. A missing or damaged file, a layer it does not know, or a graph dtrain would
refuse (a cycle, an input that names no layer) ends it with exit code 2.
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

try:
    import torch
    from torch import nn
except ImportError as e:  # main() says how to install it
    torch = nn = None
    TORCH_IMPORT_ERROR = e

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


# --- the graph -------------------------------------------------------------------------------

INPUT = -1  # where a layer takes the model's input ("inputs": ["input"], or the first layer)
KINDS = ("conv2d", "dense", "max_pooling2d", "flatten", "dropout", "relu", "activation", "add",
         "concatenate",
         "batch_normalization", "global_average_pooling2d", "zero_padding2d", "random_crop",
         "random_flip", "average_pooling2d", "rescaling", "reshape",
         "random_translation")


class Graph:
    """model.json's layers as dtrain reads them: each layer's name ("name", else
    layers.<i>.<type>), its inputs ("inputs", else the layer listed before), the output
    ("output", else the last layer), and an order in which each layer comes after its inputs.
    Layers are known by their listed index i, as model.layers[i] in messages."""

    def __init__(self, spec):
        self.layers = spec["layers"]
        if not isinstance(self.layers, list) or not self.layers:
            raise ModelError("model.layers: expected a list of at least one layer")
        self.names = self.layer_names()
        self.inputs = [self.resolve(i, layer) for i, layer in enumerate(self.layers)]
        self.output = self.output_index(spec.get("output"))
        self.order = self.topological_order()

    def where(self, i):
        """model.layers[i], with its name where it has one: how messages name a layer."""
        name = self.layers[i].get("name")
        return f"model.layers[{i}]" + (f" ({name!r})" if name is not None else "")

    def layer_names(self):
        names = {}
        for i, layer in enumerate(self.layers):
            kind = layer.get("type")
            if kind not in KINDS:
                raise ModelError(f"model.layers[{i}]: unsupported layer type {kind!r}")
            name = layer.get("name", f"layers.{i}.{kind}")
            if not isinstance(name, str) or not name or name == "input":
                raise ModelError(f"model.layers[{i}].name: expected a string other than "
                                 f"\"input\" (the model's input), found {name!r}")
            if name in names:
                raise ModelError(f"model.layers[{i}].name: {name!r} is taken by "
                                 f"model.layers[{names[name]}]")
            names[name] = i
        return list(names)

    def resolve(self, i, layer):
        """Layer i's inputs as listed indices (INPUT for the model's input)."""
        listed = layer.get("inputs")
        if listed is None:
            resolved = [i - 1 if i else INPUT]
        elif isinstance(listed, list) and listed and all(isinstance(n, str) for n in listed):
            for name in listed:
                if name != "input" and name not in self.names:
                    raise ModelError(f"{self.where(i)}: inputs: no layer is named {name!r}")
            resolved = [INPUT if name == "input" else self.names.index(name) for name in listed]
        else:
            raise ModelError(f"{self.where(i)}: inputs: expected a list of layer names, found "
                             f"{listed!r}")
        add = layer["type"] in ("add", "concatenate")  # two inputs or more
        if (len(resolved) < 2) if add else (len(resolved) != 1):
            raise ModelError(f"{self.where(i)}: {layer['type']} takes "
                             f"{'two inputs or more' if add else 'one input'}, found "
                             f"{len(resolved)}")
        return resolved

    def output_index(self, name):
        if name is None:
            return len(self.layers) - 1
        if name not in self.names:
            raise ModelError(f"model.output: no layer is named {name!r}")
        return self.names.index(name)

    def topological_order(self):
        """Among the layers whose inputs are placed, the one listed first (dtrain's order: a
        chain keeps its own). A layer the output does not use, or a cycle, is refused."""
        used, stack = set(), [self.output]
        while stack:
            i = stack.pop()
            if i not in used:
                used.add(i)
                stack.extend(j for j in self.inputs[i] if j != INPUT)
        for i in range(len(self.layers)):
            if i not in used:
                raise ModelError(f"{self.where(i)}: the output does not use this layer")
        order, placed = [], set()
        while len(order) < len(self.layers):
            ready = [i for i in range(len(self.layers)) if i not in placed
                     and all(j == INPUT or j in placed for j in self.inputs[i])]
            if not ready:
                raise ModelError(self.cycle_message(placed))
            placed.add(ready[0])
            order.append(ready[0])
        return order

    def cycle_message(self, placed):
        """Names the layers of a cycle among those not placed (each waits for an input)."""
        path = [next(i for i in range(len(self.layers)) if i not in placed)]
        while path.count(path[-1]) < 2:
            path.append(next(j for j in self.inputs[path[-1]] if j != INPUT and j not in placed))
        cycle = path[path.index(path[-1]):]
        return (f"{self.where(cycle[0])}: its inputs lead back to it (the layers form a cycle: "
                f"{' <- '.join(self.names[i] for i in cycle)})")

    def is_chain(self):
        """Whether each layer takes the one before it in the order: a torch.nn.Sequential."""
        return all(self.inputs[i] == [before]
                   for before, i in zip([INPUT] + self.order, self.order))


# --- the model -------------------------------------------------------------------------------

Module = nn.Module if nn else object  # torch missing: main() says how to install it


class Add(Module):
    """Keras's Add: the sum of the inputs, in order (dtrain's order); a flat (N, C) and an
    (N, C, 1, 1) input are the same values."""

    def forward(self, *xs):
        y = xs[0]
        for x in xs[1:]:
            y = y + x.reshape(y.shape)
        return y


class Concatenate(Module):
    """Keras's Concatenate on the channels (dtrain's NCHW axis 1); flat (N, C) inputs are
    (N, C, 1, 1) among spatial ones, and stay flat among flat ones."""

    def forward(self, *xs):
        if all(x.dim() == 2 for x in xs):
            return torch.cat(xs, dim=1)
        shape = next(x for x in xs if x.dim() == 4).shape[2:]
        return torch.cat([x.reshape(x.shape[0], -1, *shape) for x in xs], dim=1)


class SamePool2d(Module):
    """TensorFlow's "same" pooling: explicit padding (the odd pixel at the bottom and right)
    that takes no part: the maximum or the mean of each window's elements inside the input."""

    def __init__(self, mode, kernel, stride, sides):
        super().__init__()
        self.mode, self.kernel, self.stride, self.sides = mode, kernel, stride, sides

    def forward(self, x):
        pad = torch.nn.functional.pad
        if self.mode == "max":
            return torch.nn.functional.max_pool2d(pad(x, self.sides, value=-math.inf),
                                                  self.kernel, self.stride)
        total = torch.nn.functional.avg_pool2d(pad(x, self.sides), self.kernel, self.stride)
        inside = torch.nn.functional.avg_pool2d(pad(torch.ones_like(x[:1, :1]), self.sides),
                                                self.kernel, self.stride)
        return total / inside

    def extra_repr(self):
        return f"{self.mode}, kernel={self.kernel}, stride={self.stride}, sides={self.sides}"


class Rescale(Module):
    """Keras's Rescaling: x * scale + offset."""

    def __init__(self, scale, offset):
        super().__init__()
        self.scale, self.offset = scale, offset

    def forward(self, x):
        return x * self.scale + self.offset

    def extra_repr(self):
        return f"scale={self.scale}, offset={self.offset}"


class ChannelsLastReshape(Module):
    """Keras's Reshape on dtrain's NCHW (or flat) tensors: the elements in channels-last order
    reshaped to target, (h, w, c) laid out NCHW again, or (units,) flat."""

    def __init__(self, target):
        super().__init__()
        self.target = tuple(target)

    def forward(self, x):
        if x.dim() == 4:
            x = x.permute(0, 2, 3, 1)
        x = x.reshape(x.shape[0], *self.target)
        return x.permute(0, 3, 1, 2) if x.dim() == 4 else x

    def extra_repr(self):
        return f"target={self.target}"


class GlobalAveragePool2d(Module):
    """Keras's GlobalAveragePooling2D: each channel's mean over H and W, flat (N, C)."""

    def forward(self, x):
        return x.mean(dim=(2, 3))


class CentreCrop(Module):
    """random_crop at inference: the height x width window at (top, left)."""

    def __init__(self, top, left, height, width):
        super().__init__()
        self.top, self.left, self.height, self.width = top, left, height, width

    def forward(self, x):
        return x[:, :, self.top:self.top + self.height, self.left:self.left + self.width]

    def extra_repr(self):
        return f"top={self.top}, left={self.left}, height={self.height}, width={self.width}"


class GraphModel(Module):
    """Runs nodes in order, node k on the outputs of inputs[k] (node indices, INPUT for the
    model's input), and returns the last node's output. An output is dropped after its last use,
    so fan-out (one output feeding several nodes) costs no extra memory."""

    def __init__(self, nodes, inputs, names):
        super().__init__()
        self.nodes = nn.ModuleList(nodes)
        self.inputs, self.names = inputs, names
        self.last_use = {j: k for k, ins in enumerate(inputs) for j in ins}

    def with_nodes(self, nodes):
        return GraphModel(nodes, self.inputs, self.names)

    def forward(self, x):
        values = {INPUT: x}
        for k, (node, ins) in enumerate(zip(self.nodes, self.inputs)):
            values[k] = node(*[values[j] for j in ins])
            for j in set(ins):
                if self.last_use[j] == k:
                    del values[j]
        return values[len(self.nodes) - 1]

    def extra_repr(self):
        return "\n".join(f"({k}) {name} <- "
                         + ", ".join("input" if j == INPUT else self.names[j] for j in ins)
                         for k, (name, ins) in enumerate(zip(self.names, self.inputs)))


def pair(value, what):
    """Keras's int-or-pair sizes and strides."""
    if isinstance(value, int):
        return value, value
    if isinstance(value, list) and len(value) == 2 and all(isinstance(v, int) for v in value):
        return tuple(value)
    raise ModelError(f"{what}: expected an integer or a pair, found {value!r}")


def padding_sides(value, what):
    """zero_padding2d's padding as (top, bottom, left, right): an int, [rows, columns] or
    [[top, bottom], [left, right]] (dtrain's and Keras's forms)."""
    if isinstance(value, int):
        sides = (value,) * 4
    elif isinstance(value, list) and len(value) == 2 and all(isinstance(v, int) for v in value):
        sides = (value[0], value[0], value[1], value[1])
    elif isinstance(value, list) and len(value) == 2:
        sides = pair(value[0], what) + pair(value[1], what)
    else:
        sides = None
    if sides is None or min(sides) < 0:
        raise ModelError(f"{what}: expected an integer, [rows, columns] or [[top, bottom], "
                         f"[left, right]] of sizes from 0, found {value!r}")
    return sides


def same_padding(size, kernel, stride):
    """Keras/TensorFlow "same": (before, after), the odd pixel after (bottom/right)."""
    out = (size + stride - 1) // stride
    total = max((out - 1) * stride + kernel - size, 0)
    return total // 2, total - total // 2


def as_torch(array):
    return torch.from_numpy(np.array(array, order="C"))  # a copy: the file's bytes are read-only


class Builder:
    """Turns model.json's layers into torch modules, one list per layer, tracking the (c, h, w)
    of one example at each layer's output and whether its tensor is flat, (N, c) not
    (N, c, h, w)."""

    def __init__(self, spec, tensors, path):
        self.tensors, self.path = dict(tensors), path
        h, w, c = spec["input_shape"]
        self.outputs = {INPUT: ((c, h, w), False)}  # listed index: (dims, flat)
        self.softmax = False

    def node(self, graph, i):
        """The modules of layer i (its inputs built before it)."""
        layer = graph.layers[i]
        self.inputs = [self.outputs[j] for j in graph.inputs[i]]
        (self.dims, self.flat), self.modules = self.inputs[0], []
        self.prefix = graph.names[i] + "."
        getattr(self, layer["type"])(i, layer)
        if self.softmax and i != graph.order[-1]:
            raise ModelError(f"model.layers[{i}]: softmax is only supported last")
        self.outputs[i] = (self.dims, self.flat)
        return self.modules

    def take(self, name, shape):
        """The tensor dtrain stores as this layer's name, checked against the shape the layer
        needs, as a torch tensor."""
        name = self.prefix + name
        if name not in self.tensors:
            raise ModelError(f"{self.path}: has no tensor {name} (shape {list(shape)})")
        t = self.tensors.pop(name)
        if tuple(t.shape) != tuple(shape):
            raise ModelError(f"{self.path}: tensor {name} has shape {list(t.shape)}, the model "
                             f"needs {list(shape)}")
        return as_torch(t)

    def keys(self, i, layer, allowed):
        extra = set(layer) - set(allowed) - {"type", "name", "inputs"}
        if extra:
            raise ModelError(f"model.layers[{i}]: unsupported key(s) {sorted(extra)}")

    def spatial(self):
        """A layer on feature maps: a flat input becomes (N, c, 1, 1), as dtrain sees it."""
        if self.flat:
            self.modules.append(nn.Unflatten(1, self.dims))
            self.flat = False

    def use_bias(self, i, layer):
        use_bias = layer.get("use_bias", True)
        if not isinstance(use_bias, bool):
            raise ModelError(f"model.layers[{i}].use_bias: expected true or false")
        return use_bias

    def conv2d(self, i, layer):
        self.keys(i, layer, {"filters", "kernel_size", "strides", "padding", "activation",
                             "use_bias", "kernel_initializer", "kernel_regularizer",
                             "bias_regularizer"})  # regularizers: training only
        self.spatial()
        c, h, w = self.dims
        k, bias = layer["filters"], self.use_bias(i, layer)
        kh, kw = pair(layer["kernel_size"], f"model.layers[{i}].kernel_size")
        sh, sw = pair(layer.get("strides", 1), f"model.layers[{i}].strides")
        padding = layer.get("padding", "valid")
        if padding == "same":
            (top, bottom), (left, right) = same_padding(h, kh, sh), same_padding(w, kw, sw)
            if top or bottom or left or right:  # explicit: torch's "same" pads the other side
                self.modules.append(nn.ZeroPad2d((left, right, top, bottom)))
            h, w = h + top + bottom, w + left + right
        elif padding != "valid":
            raise ModelError(f"model.layers[{i}].padding: unsupported {padding!r}")
        conv = nn.Conv2d(c, k, (kh, kw), stride=(sh, sw), bias=bias)
        with torch.no_grad():  # dtrain's kernel is [out, in, kh, kw]: Conv2d's layout as it is
            conv.weight.copy_(self.take("kernel", (k, c, kh, kw)))
            if bias:
                conv.bias.copy_(self.take("bias", (k,)))
        self.modules.append(conv)
        self.dims = (k, (h - kh) // sh + 1, (w - kw) // sw + 1)
        self.activation(i, layer)

    def dense(self, i, layer):
        self.keys(i, layer, {"units", "activation", "use_bias", "kernel_initializer",
                             "kernel_regularizer", "bias_regularizer"})
        c, h, w = self.dims
        if h != 1 or w != 1:
            raise ModelError(f"model.layers[{i}]: dense needs flat input ({h}x{w}x{c})")
        if not self.flat:  # a 1x1 feature map: dtrain counts it flat
            self.modules.append(nn.Flatten())
        units, bias = layer["units"], self.use_bias(i, layer)
        linear = nn.Linear(c, units, bias=bias)
        with torch.no_grad():  # dtrain's kernel is [in, out] (Keras's); Linear.weight is [out, in]
            linear.weight.copy_(self.take("kernel", (c, units)).T)
            if bias:
                linear.bias.copy_(self.take("bias", (units,)))
        self.modules.append(linear)
        self.dims, self.flat = (units, 1, 1), True
        self.activation(i, layer)

    def max_pooling2d(self, i, layer, mode="max", default_pool=2):
        self.keys(i, layer, {"pool_size", "strides", "padding"})
        self.spatial()
        c, h, w = self.dims
        if default_pool is None and "pool_size" not in layer:
            raise ModelError(f"model.layers[{i}]: pool_size is required")
        ph, pw = pair(layer.get("pool_size", default_pool), f"model.layers[{i}].pool_size")
        strides = layer.get("strides")  # Keras: strides default to pool_size
        sh, sw = (ph, pw) if strides is None else pair(strides, f"model.layers[{i}].strides")
        padding = layer.get("padding", "valid")
        if padding == "same":
            (top, bottom), (left, right) = same_padding(h, ph, sh), same_padding(w, pw, sw)
            self.modules.append(SamePool2d(mode, (ph, pw), (sh, sw), (left, right, top, bottom)))
            self.dims = (c, (h + sh - 1) // sh, (w + sw - 1) // sw)
            return
        if padding != "valid":
            raise ModelError(f"model.layers[{i}].padding: unsupported {padding!r}")
        pool = nn.MaxPool2d if mode == "max" else nn.AvgPool2d
        self.modules.append(pool((ph, pw), stride=(sh, sw)))
        self.dims = (c, (h - ph) // sh + 1, (w - pw) // sw + 1)

    def rescaling(self, i, layer):
        self.keys(i, layer, {"scale", "offset"})
        self.modules.append(Rescale(float(layer["scale"]), float(layer.get("offset", 0.0))))

    def reshape(self, i, layer):
        self.keys(i, layer, {"target_shape"})
        c, h, w = self.dims
        target = list(layer["target_shape"])
        if target.count(-1) == 1:
            known = math.prod(v for v in target if v != -1)
            target[target.index(-1)] = c * h * w // known
        if len(target) not in (1, 3) or math.prod(target) != c * h * w:
            raise ModelError(f"model.layers[{i}].target_shape: {layer['target_shape']} does not "
                             f"hold the input's {c * h * w} values")
        self.modules.append(ChannelsLastReshape(target))
        if len(target) == 1:
            self.dims, self.flat = (target[0], 1, 1), True
        else:
            self.dims, self.flat = (target[2], target[0], target[1]), False

    def average_pooling2d(self, i, layer):
        self.max_pooling2d(i, layer, mode="average", default_pool=None)

    def flatten(self, i, layer):
        self.keys(i, layer, set())
        self.modules.append(nn.Flatten())  # dtrain's activations are NCHW: (c, h, w) order
        c, h, w = self.dims
        self.dims, self.flat = (c * h * w, 1, 1), True

    def dropout(self, i, layer):
        self.keys(i, layer, {"rate"})
        self.modules.append(nn.Dropout(layer["rate"]))  # identity in eval()

    def relu(self, i, layer):
        self.keys(i, layer, set())
        self.modules.append(nn.ReLU())

    def add(self, i, layer):
        self.keys(i, layer, set())
        for k, (dims, _) in enumerate(self.inputs):
            if dims != self.dims:
                raise ModelError(f"model.layers[{i}]: add needs inputs of one shape; input 0 is "
                                 f"{self.dims} (c, h, w), input {k} is {dims}")
        self.modules.append(Add())

    def concatenate(self, i, layer):
        self.keys(i, layer, {"axis"})
        if layer.get("axis", -1) not in (-1, 3):
            raise ModelError(f"model.layers[{i}].axis: unsupported {layer['axis']!r}")
        _, h, w = self.dims
        for k, (dims, _) in enumerate(self.inputs):
            if dims[1:] != (h, w):
                raise ModelError(f"model.layers[{i}]: concatenate needs inputs of one height and "
                                 f"width; input 0 is {self.dims} (c, h, w), input {k} is {dims}")
        self.dims = (sum(dims[0] for dims, _ in self.inputs), h, w)
        self.flat = all(flat for _, flat in self.inputs)
        self.modules.append(Concatenate())

    def batch_normalization(self, i, layer):
        """Keras's BatchNormalization at inference: (x - moving_mean) / sqrt(moving_variance +
        epsilon) * gamma + beta, per channel. PyTorch's momentum is 1 - Keras's."""
        self.keys(i, layer, {"axis", "momentum", "epsilon", "center", "scale", "synchronized"})
        if layer.get("axis", -1) not in (-1, 3, [-1], [3]):
            raise ModelError(f"model.layers[{i}].axis: only the channels (-1 or 3) are supported")
        center, scale = layer.get("center", True), layer.get("scale", True)
        c = self.dims[0]
        norm = (nn.BatchNorm1d if self.flat else nn.BatchNorm2d)(
            c, eps=layer.get("epsilon", 1e-3), momentum=round(1 - layer.get("momentum", 0.99), 12),
            affine=bool(center or scale))
        with torch.no_grad():
            if scale:
                norm.weight.copy_(self.take("gamma", (c,)))
            elif norm.affine:  # Keras has no gamma then: one, not trained
                norm.weight.requires_grad_(False)
            if center:
                norm.bias.copy_(self.take("beta", (c,)))
            elif norm.affine:  # no beta: zero, not trained
                norm.bias.requires_grad_(False)
            norm.running_mean.copy_(self.take("moving_mean", (c,)))
            norm.running_var.copy_(self.take("moving_variance", (c,)))
        self.modules.append(norm)

    def global_average_pooling2d(self, i, layer):
        self.keys(i, layer, {"keepdims"})  # dtrain's output is flat either way
        self.spatial()
        self.modules.append(GlobalAveragePool2d())
        self.dims, self.flat = (self.dims[0], 1, 1), True

    def zero_padding2d(self, i, layer):
        self.keys(i, layer, {"padding"})
        top, bottom, left, right = padding_sides(layer.get("padding", 1),
                                                 f"model.layers[{i}].padding")
        self.spatial()
        self.modules.append(nn.ZeroPad2d((left, right, top, bottom)))
        c, h, w = self.dims
        self.dims = (c, h + top + bottom, w + left + right)

    def random_crop(self, i, layer):
        """At inference, the centre: dtrain's offset ((h - height) // 2, (w - width) // 2)."""
        self.keys(i, layer, {"height", "width"})
        self.spatial()
        c, h, w = self.dims
        height, width = layer["height"], layer["width"]
        if not 1 <= height <= h or not 1 <= width <= w:
            raise ModelError(f"model.layers[{i}]: a {height}x{width} crop does not fit the "
                             f"{h}x{w} input")
        self.modules.append(CentreCrop((h - height) // 2, (w - width) // 2, height, width))
        self.dims = (c, height, width)

    def random_flip(self, i, layer):
        self.keys(i, layer, {"mode"})
        if layer.get("mode", "horizontal_and_vertical") not in (
                "horizontal", "vertical", "horizontal_and_vertical"):
            raise ModelError(f"model.layers[{i}].mode: unsupported {layer['mode']!r}")
        self.modules.append(nn.Identity())  # inference does not flip

    def random_translation(self, i, layer):
        self.keys(i, layer, {"height_factor", "width_factor", "fill_mode", "interpolation",
                             "fill_value"})
        self.modules.append(nn.Identity())  # inference does not translate

    def activation(self, i, layer):
        """A conv2d's or dense's activation, or an activation layer's."""
        name = layer.get("activation") or "linear"
        modules = {"relu": nn.ReLU, "sigmoid": nn.Sigmoid, "tanh": nn.Tanh, "gelu": nn.GELU,
                   "silu": nn.SiLU, "swish": nn.SiLU}  # GELU: the erf form, Keras's default
        if name in modules:
            self.modules.append(modules[name]())
        elif name == "softmax":
            self.modules.append(nn.Softmax(dim=1))
            self.softmax = True
        elif name != "linear":
            raise ModelError(f"model.layers[{i}].activation: unsupported {name!r}")


def build_model(spec, tensors, path):
    """The torch module of model.json's spec with the weights in tensors (eval mode): a
    torch.nn.Sequential for a chain, else a GraphModel; and whether its output ends in a
    softmax (evaluate drops it to get logits)."""
    try:
        graph = Graph(spec)
        builder = Builder(spec, tensors, path)
        nodes = [builder.node(graph, i) for i in graph.order]
    except (AttributeError, KeyError, TypeError, ValueError) as e:
        raise ModelError(f"model.json: not a dtrain model ({type(e).__name__}: {e})") from None
    if builder.tensors:
        raise ModelError(f"{path}: tensors the model does not use: {sorted(builder.tensors)}")
    if graph.is_chain():
        return nn.Sequential(*[m for node in nodes for m in node]).eval(), builder.softmax
    place = {i: k for k, i in enumerate(graph.order)}
    inputs = [[INPUT if j == INPUT else place[j] for j in graph.inputs[i]] for i in graph.order]
    modules = [node[0] if isinstance(node[0], (Add, Concatenate)) else nn.Sequential(*node)
               for node in nodes]
    names = [graph.names[i] for i in graph.order]
    return GraphModel(modules, inputs, names).eval(), builder.softmax


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


def map_sequentials(model, change):
    """The model with change(s) for each nn.Sequential s of it: the model itself for a chain,
    each node of a GraphModel but its adds."""
    if isinstance(model, nn.Sequential):
        return change(model)
    return model.with_nodes([change(node) if isinstance(node, nn.Sequential) else node
                             for node in model.nodes])


def logits_of(model, softmax):
    """The model without its output's softmax (the last module of the last node)."""
    if not softmax:
        return model
    last = model if isinstance(model, nn.Sequential) else model.nodes[-1]
    return map_sequentials(model, lambda s: s[:-1] if s is last else s)


def with_onednn_linear(model):
    """The model with each nn.Linear run by oneDNN (dense tensors in and out, the same math):
    Debian's torch multiplies with the reference BLAS, 20 times slower on the tutorial CNN."""
    if not torch.backends.mkldnn.is_available():
        return model
    from torch.utils.mkldnn import MkldnnLinear
    return map_sequentials(model, lambda s: nn.Sequential(
        *[MkldnnLinear(m, torch.float) if isinstance(m, nn.Linear) else m for m in s]))


def evaluate(model, softmax, images, labels, batch=1000):
    """Mean cross-entropy of the logits and accuracy (first maximum wins, as in dtrain)."""
    import torch.nn.functional as F
    logits_model = with_onednn_linear(logits_of(model, softmax))
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
    if torch is None:
        sys.exit(f"load_dtrain_model: needs PyTorch ({TORCH_IMPORT_ERROR}); on Debian: "
                 f"apt install python3-torch")
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
