#!/usr/bin/env python3
"""Loads the final model of a dtrain run into PyTorch and evaluates it on the test split.

    load_dtrain_model.py RUN_DIR [--data DIR] [--text FILE] [--validation-split F] [--json]

Reads RUN_DIR/model/model.json (the job's `train.model`) and RUN_DIR/model/model.safetensors
(parsed here with struct, json and numpy: Debian has no `safetensors` package), builds the same
architecture (a torch.nn.Sequential for a chain of layers, a GraphModel for a graph: named
inputs, residual adds, fan-out, layers listed in any order), and evaluates it on the whole IDX
test split, with pixels scaled as dtrain scales them (byte / 255); a language model
(input_shape [T]: token_and_position_embedding, layer_normalization, multi_head_attention,
dense on each position) on every non-overlapping window of its text's validation split, as
dtrain's val_loss (docs/language-models.md). Tensor layouts and their
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
         "random_translation", "embedding", "position_embedding", "token_and_position_embedding",
         "layer_normalization", "multi_head_attention")
# The kinds that take a sequence (input_shape [T], positions x features), as dtrain's
# output_dims do; every other kind refuses one.
SEQUENCE_KINDS = ("embedding", "position_embedding", "token_and_position_embedding",
                  "layer_normalization", "multi_head_attention", "dense", "add", "dropout",
                  "activation", "relu", "rescaling", "flatten")


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


class TokenAndPositionEmbedding(Module):
    """keras_hub's TokenAndPositionEmbedding: each id's row of the token table plus its
    position's row of the position table."""

    def __init__(self, vocabulary, length, dim):
        super().__init__()
        self.token = nn.Embedding(vocabulary, dim)
        self.position = nn.Parameter(torch.empty(length, dim))

    def forward(self, ids):
        return self.token(ids) + self.position[:ids.shape[1]]


class PositionEmbedding(Module):
    """keras_hub's PositionEmbedding: the table's first T rows for every example (the input
    gives only its shape)."""

    def __init__(self, length, dim):
        super().__init__()
        self.table = nn.Parameter(torch.empty(length, dim))

    def forward(self, x):
        return self.table[:x.shape[1]].expand(x.shape[0], -1, -1)


class LayerNorm(Module):
    """Keras's LayerNormalization on the last axis: gamma without beta (center false) or beta
    without gamma, which torch.nn.LayerNorm cannot leave out one at a time."""

    def __init__(self, features, epsilon, scale, center):
        super().__init__()
        self.features, self.epsilon = features, epsilon
        self.weight = nn.Parameter(torch.ones(features)) if scale else None
        self.bias = nn.Parameter(torch.zeros(features)) if center else None

    def forward(self, x):
        return torch.nn.functional.layer_norm(x, (self.features,), self.weight, self.bias,
                                              self.epsilon)

    def extra_repr(self):
        return (f"{self.features}, eps={self.epsilon}, gamma={self.weight is not None}, "
                f"beta={self.bias is not None}")


class SelfAttention(Module):
    """Keras's MultiHeadAttention as self-attention, in its EinsumDense layouts: query, key and
    value kernels (D, heads, key_dim or value_dim), biases (heads, dim), the output kernel
    (heads, value_dim, D) and bias (D); scores q.k / sqrt(key_dim), a key after the query
    masked out when causal."""

    def __init__(self, dim, heads, key_dim, value_dim, use_bias, causal):
        super().__init__()
        self.heads, self.key_dim, self.value_dim, self.causal = heads, key_dim, value_dim, causal
        empty = lambda *shape: nn.Parameter(torch.empty(*shape))  # noqa: E731
        self.query_kernel, self.key_kernel = empty(dim, heads, key_dim), empty(dim, heads, key_dim)
        self.value_kernel, self.output_kernel = empty(dim, heads, value_dim), empty(
            heads, value_dim, dim)
        self.use_bias = use_bias
        if use_bias:
            self.query_bias, self.key_bias = empty(heads, key_dim), empty(heads, key_dim)
            self.value_bias, self.output_bias = empty(heads, value_dim), empty(dim)

    def project(self, x, kernel, bias):
        """(N, T, D) times a (D, heads, dim) kernel: (N, heads, T, dim)."""
        n, t, d = x.shape
        y = (x @ kernel.reshape(d, -1)).view(n, t, kernel.shape[1], kernel.shape[2])
        if bias is not None:
            y = y + bias
        return y.transpose(1, 2)

    def forward(self, x):
        n, t, d = x.shape
        bias = (lambda name: getattr(self, name)) if self.use_bias else (lambda name: None)
        q = self.project(x, self.query_kernel, bias("query_bias"))
        k = self.project(x, self.key_kernel, bias("key_bias"))
        v = self.project(x, self.value_kernel, bias("value_bias"))
        scores = (q @ k.transpose(-1, -2)) * (1.0 / math.sqrt(self.key_dim))
        if self.causal:
            later = torch.ones(t, t, dtype=torch.bool, device=x.device).triu(1)
            scores = scores.masked_fill(later, -math.inf)
        o = (scores.softmax(dim=-1) @ v).transpose(1, 2).reshape(n, t, -1)
        y = o @ self.output_kernel.reshape(-1, d)
        return y + self.output_bias if self.use_bias else y

    def extra_repr(self):
        return (f"heads={self.heads}, key_dim={self.key_dim}, value_dim={self.value_dim}, "
                f"use_bias={self.use_bias}, causal={self.causal}")


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

    def __init__(self, spec, tensors, path, graph):
        self.tensors, self.path = dict(tensors), path
        shape = spec["input_shape"]
        # [n] is a sequence of n token ids when an embedding reads the input, else n features
        # (tabular rows, (N, n)), as dtrain reads it.
        tokens = any(INPUT in graph.inputs[i] and layer["type"] in
                     ("embedding", "token_and_position_embedding")
                     for i, layer in enumerate(graph.layers))
        if len(shape) == 1 and tokens:  # dtrain's Dims{1, T, 1, sequence}
            self.outputs = {INPUT: ((1, shape[0], 1), False, True)}
        elif len(shape) == 1:  # features: a 1x1 image of n channels, flat
            self.outputs = {INPUT: ((shape[0], 1, 1), True, False)}
        else:
            h, w, c = shape
            self.outputs = {INPUT: ((c, h, w), False, False)}  # listed index: (dims, flat, seq)
        self.softmax = False
        self.named = []  # (dtrain's tensor name, the torch parameter it went into)

    def node(self, graph, i):
        """The modules of layer i (its inputs built before it)."""
        layer = graph.layers[i]
        self.inputs = [self.outputs[j] for j in graph.inputs[i]]
        (self.dims, self.flat, self.sequence), self.modules = self.inputs[0], []
        self.prefix = graph.names[i] + "."
        if self.sequence and layer["type"] not in SEQUENCE_KINDS:
            raise ModelError(f"{graph.where(i)}: {layer['type']} does not take a sequence "
                             f"(positions x features), as in dtrain")
        getattr(self, layer["type"])(i, layer)
        if self.softmax and i != graph.order[-1]:
            raise ModelError(f"model.layers[{i}]: softmax is only supported last")
        self.outputs[i] = (self.dims, self.flat, self.sequence)
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

    def load(self, parameter, name, shape, transform=None):
        """Copies the tensor named name (take's checks), through transform, into parameter, and
        notes the parameter under dtrain's name (bench/gpt_torch.py decays by it)."""
        t = self.take(name, shape)
        with torch.no_grad():
            parameter.copy_(transform(t) if transform else t)
        self.named.append((self.prefix + name, parameter))

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
        # dtrain's kernel is [out, in, kh, kw]: Conv2d's layout as it is
        self.load(conv.weight, "kernel", (k, c, kh, kw))
        if bias:
            self.load(conv.bias, "bias", (k,))
        self.modules.append(conv)
        self.dims = (k, (h - kh) // sh + 1, (w - kw) // sw + 1)
        self.activation(i, layer)

    def dense(self, i, layer):
        self.keys(i, layer, {"units", "activation", "use_bias", "kernel_initializer",
                             "kernel_regularizer", "bias_regularizer"})
        c, h, w = self.dims
        if self.sequence:  # Keras's Dense on (T, D): each position, Linear on the last axis
            c = w
        elif h != 1 or w != 1:
            raise ModelError(f"model.layers[{i}]: dense needs flat input ({h}x{w}x{c})")
        elif not self.flat:  # a 1x1 feature map: dtrain counts it flat
            self.modules.append(nn.Flatten())
        units, bias = layer["units"], self.use_bias(i, layer)
        linear = nn.Linear(c, units, bias=bias)
        # dtrain's kernel is [in, out] (Keras's); Linear.weight is [out, in]
        self.load(linear.weight, "kernel", (c, units), lambda t: t.T)
        if bias:
            self.load(linear.bias, "bias", (units,))
        self.modules.append(linear)
        if self.sequence:
            self.dims = (1, h, units)
        else:
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
        self.modules.append(nn.Flatten())  # NCHW: (c, h, w) order; a sequence's: position-major
        c, h, w = self.dims
        self.dims, self.flat, self.sequence = (c * h * w, 1, 1), True, False

    def dropout(self, i, layer):
        self.keys(i, layer, {"rate"})
        self.modules.append(nn.Dropout(layer["rate"]))  # identity in eval()

    def relu(self, i, layer):
        self.keys(i, layer, set())
        self.modules.append(nn.ReLU())

    def add(self, i, layer):
        self.keys(i, layer, set())
        for k, (dims, _, sequence) in enumerate(self.inputs):
            if dims != self.dims or sequence != self.sequence:
                raise ModelError(f"model.layers[{i}]: add needs inputs of one shape; input 0 is "
                                 f"{self.dims} (c, h, w), input {k} is {dims}")
        self.modules.append(Add())

    def concatenate(self, i, layer):
        self.keys(i, layer, {"axis"})
        if layer.get("axis", -1) not in (-1, 3):
            raise ModelError(f"model.layers[{i}].axis: unsupported {layer['axis']!r}")
        _, h, w = self.dims
        for k, (dims, _, _) in enumerate(self.inputs):
            if dims[1:] != (h, w):
                raise ModelError(f"model.layers[{i}]: concatenate needs inputs of one height and "
                                 f"width; input 0 is {self.dims} (c, h, w), input {k} is {dims}")
        self.dims = (sum(dims[0] for dims, _, _ in self.inputs), h, w)
        self.flat = all(flat for _, flat, _ in self.inputs)
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

    def token_ids(self, i, kind):
        """Checks that the layer's input is a sequence of token ids (input_shape [T])."""
        c, _, w = self.dims
        if not self.sequence or c != 1 or w != 1:
            raise ModelError(f"model.layers[{i}]: {kind} takes a sequence of token ids "
                             f"(input_shape [T])")

    def refuse(self, i, layer, key, value, why):
        """dtrain's refusal of a key it does not compute."""
        if key in layer and layer[key] != value:
            raise ModelError(f"model.layers[{i}].{key}: {layer[key]!r} is not supported ({why})")

    def embedding(self, i, layer):
        self.keys(i, layer, {"input_dim", "output_dim", "embeddings_initializer", "mask_zero"})
        self.token_ids(i, "embedding")
        self.refuse(i, layer, "mask_zero", False, "dtrain has no masks")
        rows, dim = layer["input_dim"], layer["output_dim"]
        table = nn.Embedding(rows, dim)
        self.load(table.weight, "embeddings", (rows, dim))
        self.modules.append(table)
        self.dims = (1, self.dims[1], dim)

    def token_and_position_embedding(self, i, layer):
        self.keys(i, layer, {"vocabulary_size", "sequence_length", "embedding_dim",
                             "embeddings_initializer", "tie_weights", "mask_zero"})
        self.token_ids(i, "token_and_position_embedding")
        self.refuse(i, layer, "mask_zero", False, "dtrain has no masks")
        self.refuse(i, layer, "tie_weights", True, "dtrain keeps no reverse table")
        rows, length, dim = layer["vocabulary_size"], layer["sequence_length"], layer[
            "embedding_dim"]
        t = self.dims[1]
        if t > length:
            raise ModelError(f"model.layers[{i}]: its input has {t} positions, more than its "
                             f"sequence_length {length}")
        module = TokenAndPositionEmbedding(rows, length, dim)
        self.load(module.token.weight, "token_embedding.embeddings", (rows, dim))
        self.load(module.position, "position_embedding.embeddings", (length, dim))
        self.modules.append(module)
        self.dims = (1, t, dim)

    def position_embedding(self, i, layer):
        self.keys(i, layer, {"sequence_length", "initializer"})
        _, t, dim = self.dims
        length = layer["sequence_length"]
        if t > length:
            raise ModelError(f"model.layers[{i}]: its input has {t} positions, more than its "
                             f"sequence_length {length}")
        module = PositionEmbedding(length, dim)
        self.load(module.table, "embeddings", (length, dim))
        self.modules.append(module)

    def layer_normalization(self, i, layer):
        """Each position (or a flat input) by its own mean and biased variance."""
        self.keys(i, layer, {"axis", "epsilon", "center", "scale", "rms_scaling"})
        self.refuse(i, layer, "rms_scaling", False, "Keras deprecates it")
        c, h, w = self.dims
        if not self.sequence and not self.flat:
            if h != 1 or w != 1:
                raise ModelError(f"model.layers[{i}]: layer_normalization takes a sequence or "
                                 f"flat features, not a {h}x{w}x{c} image")
            self.modules.append(nn.Flatten())
            self.flat = True
        axis = layer.get("axis", -1)
        axis = axis[0] if isinstance(axis, list) and len(axis) == 1 else axis
        if axis not in (-1, 2 if self.sequence else 1):
            raise ModelError(f"model.layers[{i}].axis: {layer['axis']!r} is not supported "
                             f"(dtrain normalizes the last axis)")
        features = w if self.sequence else c
        scale, center = layer.get("scale", True), layer.get("center", True)
        norm = LayerNorm(features, layer.get("epsilon", 1e-3), scale, center)
        if scale:
            self.load(norm.weight, "gamma", (features,))
        if center:
            self.load(norm.bias, "beta", (features,))
        self.modules.append(norm)

    def multi_head_attention(self, i, layer):
        self.keys(i, layer, {"num_heads", "key_dim", "value_dim", "use_bias", "causal",
                             "use_causal_mask", "dropout", "kernel_initializer",
                             "bias_initializer"})
        if layer.get("dropout", 0) != 0:
            raise ModelError(f"model.layers[{i}].dropout: attention dropout is not supported")
        _, _, dim = self.dims
        heads, key_dim = layer["num_heads"], layer["key_dim"]
        value_dim = layer.get("value_dim") or key_dim
        use_bias = self.use_bias(i, layer)
        causal = bool(layer.get("use_causal_mask", layer.get("causal", False)))  # dtrain's order
        attention = SelfAttention(dim, heads, key_dim, value_dim, use_bias, causal)
        for part, kernel, width in (("query", attention.query_kernel, key_dim),
                                    ("key", attention.key_kernel, key_dim),
                                    ("value", attention.value_kernel, value_dim)):
            self.load(kernel, f"{part}.kernel", (dim, heads, width))
            if use_bias:
                self.load(getattr(attention, f"{part}_bias"), f"{part}.bias", (heads, width))
        self.load(attention.output_kernel, "attention_output.kernel", (heads, value_dim, dim))
        if use_bias:
            self.load(attention.output_bias, "attention_output.bias", (dim,))
        self.modules.append(attention)

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
            self.modules.append(nn.Softmax(dim=-1))  # the classes: a flat or sequence's last axis
            self.softmax = True
        elif name != "linear":
            raise ModelError(f"model.layers[{i}].activation: unsupported {name!r}")


def build_model(spec, tensors, path):
    """The torch module of model.json's spec with the weights in tensors (eval mode): a
    torch.nn.Sequential for a chain, else a GraphModel; and whether its output ends in a
    softmax (evaluate drops it to get logits)."""
    try:
        graph = Graph(spec)
        builder = Builder(spec, tensors, path, graph)
        nodes = [builder.node(graph, i) for i in graph.order]
    except (AttributeError, KeyError, TypeError, ValueError) as e:
        raise ModelError(f"model.json: not a dtrain model ({type(e).__name__}: {e})") from None
    if builder.tensors:
        raise ModelError(f"{path}: tensors the model does not use: {sorted(builder.tensors)}")
    if graph.is_chain():
        model = nn.Sequential(*[m for node in nodes for m in node])
    else:
        place = {i: k for k, i in enumerate(graph.order)}
        inputs = [[INPUT if j == INPUT else place[j] for j in graph.inputs[i]]
                  for i in graph.order]
        modules = [node[0] if isinstance(node[0], (Add, Concatenate)) else nn.Sequential(*node)
                   for node in nodes]
        model = GraphModel(modules, inputs, [graph.names[i] for i in graph.order])
    model.dtrain_tensors = builder.named  # [(dtrain's tensor name, its torch parameter)]
    return model.eval(), builder.softmax


def load_model(run_dir):
    """(model, model.json's object, ends_with_softmax) of RUN_DIR/model."""
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
        # model.json may begin with the run's dtype_policy, class_names and vocabulary, which
        # the weights' metadata keeps apart; the weights are fp32 whatever the policy.
        plain = {k: v for k, v in spec.items()
                 if k not in ("dtype_policy", "class_names", "vocabulary")} \
            if isinstance(spec, dict) else spec
        if architecture != plain:
            raise ModelError(f"{weights_path}: its architecture differs from {spec_path}")
        if isinstance(spec, dict) and spec.get("dtype_policy", "float32") != metadata.get(
                "dtype_policy", "float32"):
            raise ModelError(f"{weights_path}: its dtype_policy differs from {spec_path}")
    if not isinstance(spec, dict) or "input_shape" not in spec or "layers" not in spec:
        raise ModelError(f"{spec_path}: expected {{\"input_shape\": ..., \"layers\": ...}}")
    model, softmax = build_model(spec, tensors, weights_path)
    return model, spec, softmax


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


# --- a language model's validation split ---------------------------------------------------


def run_data(run_dir):
    """The run's spec.json `train.data` ({} when there is none)."""
    try:
        with open(os.path.join(run_dir, "spec.json"), encoding="utf-8") as f:
            data = json.load(f).get("train", {}).get("data", {})
    except (OSError, ValueError, AttributeError):
        data = {}
    return data if isinstance(data, dict) else {}


def read_bytes(path):
    try:
        with open(path, "rb") as f:
            return f.read()
    except OSError as e:
        raise ModelError(f"{path}: cannot read: {e.strerror}") from None


def text_ids(path, vocabulary):
    """The file's token ids under model.json's vocabulary: "characters" (the sorted set of the
    file's characters, which must be the model's symbols: it is the file trained on), "bytes",
    or "tokens" (a flat file of uint16 ids below its size)."""
    kind = vocabulary.get("kind")
    raw = read_bytes(path)
    if kind == "bytes":
        return np.frombuffer(raw, dtype=np.uint8).astype(np.int64)
    if kind == "tokens":
        if len(raw) % 2:
            raise ModelError(f"{path}: {len(raw)} bytes is not a whole number of uint16 ids")
        ids = np.frombuffer(raw, dtype="<u2").astype(np.int64)
        if len(ids) and ids.max() >= vocabulary["size"]:
            raise ModelError(f"{path}: an id is {ids.max()}, not below {vocabulary['size']}")
        return ids
    if kind != "characters":
        raise ModelError(f"model.json: unknown vocabulary kind {kind!r}")
    try:
        text = raw.decode("utf-8")  # bytes, not open(): no newline translation, as dtrain
    except UnicodeDecodeError as e:
        raise ModelError(f"{path}: byte {e.start} is not valid UTF-8") from None
    symbols = vocabulary["symbols"]
    if sorted(set(text)) != symbols:
        raise ModelError(f"{path}: its characters ({len(set(text))}) are not the model's "
                         f"vocabulary ({len(symbols)}): not the text it was trained on")
    codes = np.frombuffer(text.encode("utf-32-le"), dtype="<u4")
    return np.searchsorted(np.array([ord(c) for c in symbols], dtype=np.uint32),
                           codes).astype(np.int64)


def load_text_validation(run_dir, spec, text=None, validation_split=None):
    """dtrain's validation split of a language model's data as (x, y), each (windows, T) int64:
    window i is x = t[iT, iT + T), y = t[iT + 1, iT + T + 1), every non-overlapping window of
    the split's tokens t. The split: the last fraction of the text (its first
    floor(n x (1 - fraction)) tokens train), or a tokens source's validation_path. The file and
    fraction: --text and --validation-split, else the run's spec.json `train.data`."""
    vocabulary = spec.get("vocabulary")
    if not isinstance(vocabulary, dict):
        raise ModelError(f"{run_dir}/model/model.json: no \"vocabulary\" (a language model "
                         f"trained on a text or tokens source has one)")
    data = {} if text else run_data(run_dir)
    path = text or data.get("path")
    if not path:
        raise ModelError(f"{run_dir}/spec.json: no text or tokens source; pass --text FILE")
    fraction = validation_split
    if fraction is None:
        fraction = None if data.get("validation_path") else data.get("validation_split", 0.1)
    if fraction is None:
        t = text_ids(data["validation_path"], vocabulary)
    else:
        if not 0 < fraction < 1:
            raise ModelError(f"--validation-split: expected a fraction in (0, 1), not {fraction}")
        ids = text_ids(path, vocabulary)
        t = ids[int(float(len(ids)) * (1 - fraction)):]  # dtrain's split, in double
    length = spec["input_shape"][0]
    windows = (len(t) - 1) // length
    if windows < 1:
        raise ModelError(f"{path}: the validation split's {len(t)} tokens hold no window of "
                         f"{length} (+ 1 for the last label)")
    x = t[:windows * length].reshape(windows, length)
    y = t[1:windows * length + 1].reshape(windows, length)
    return x, y


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


def evaluate_text(model, softmax, x, y, batch=64):
    """Mean cross-entropy over every position of every window (dtrain's val_loss) and the
    share of positions whose first maximum is the label."""
    import torch.nn.functional as F
    logits_model = logits_of(model, softmax)
    loss, correct = 0.0, 0
    with torch.no_grad():
        for start in range(0, len(x), batch):
            ids = torch.from_numpy(x[start:start + batch])
            labels = torch.from_numpy(y[start:start + batch]).reshape(-1)
            logits = logits_model(ids).reshape(len(labels), -1)
            loss += F.cross_entropy(logits.double(), labels, reduction="sum").item()
            correct += int((logits.argmax(dim=1) == labels).sum())
    positions = max(x.size, 1)
    return {"accuracy": correct / positions, "loss": loss / positions, "examples": len(x),
            "positions": int(x.size)}


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("run_dir", metavar="RUN_DIR", help="a dtrain run folder (has model/)")
    parser.add_argument("--data", metavar="DIR",
                        help="folder of t10k-images-idx3-ubyte[.gz] and t10k-labels-idx1-ubyte"
                             "[.gz] (default: the run's train.data, else " + DEFAULT_DATA_DIR + ")")
    parser.add_argument("--text", metavar="FILE",
                        help="a language model's text (or tokens) file, instead of the run's "
                             "train.data path")
    parser.add_argument("--validation-split", metavar="F", type=float,
                        help="the fraction at the text's end that validates (default: the "
                             "run's, else 0.1)")
    parser.add_argument("--json", action="store_true",
                        help='print {"accuracy": ..., "loss": ..., "examples": ...} only')
    args = parser.parse_args()
    if torch is None:
        sys.exit(f"load_dtrain_model: needs PyTorch ({TORCH_IMPORT_ERROR}); on Debian: "
                 f"apt install python3-torch")
    try:
        model, spec, softmax = load_model(args.run_dir)
        language = len(spec["input_shape"]) == 1
        if language:
            x, y = load_text_validation(args.run_dir, spec, args.text, args.validation_split)
        else:
            images, labels = load_test_split(args.run_dir, args.data, spec["input_shape"])
    except ModelError as e:
        print(f"load_dtrain_model: error: {e}", file=sys.stderr)
        sys.exit(2)
    if language:
        result = evaluate_text(model, softmax, x, y)
    else:
        result = evaluate(model, softmax, images, labels)
    if args.json:
        print(json.dumps(result))
        return
    print(model)
    if language:
        print(f"validation split: {result['examples']} windows of {x.shape[1]} tokens, loss "
              f"{result['loss']:.4f}, accuracy {result['accuracy']:.4f}")
    else:
        print(f"test split: {result['examples']} examples, loss {result['loss']:.4f}, "
              f"accuracy {result['accuracy']:.4f}")


if __name__ == "__main__":
    main()
