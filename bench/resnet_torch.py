#!/usr/bin/python3
"""A dtrain job's model trained by PyTorch DDP: the same graph, data and hyper-parameters.

    resnet_torch.py JOB.json [--workers N] [--epochs E] [--steps S] [--data DIR]

Builds the job's `train.model` (dtrain's JSON: a chain or a graph) as torch modules with
examples/pytorch/load_dtrain_model.py's builder, its weights drawn afresh the way the layers'
Keras initializers draw them (he_normal: a normal truncated at two deviations of
sqrt(2 / fan_in); glorot_uniform; biases and beta zero, gamma one), and trains it with N gloo
ranks of one thread each, as dtrain's N workers:
- each rank takes every N-th example of a per-epoch shuffle and a batch of
  `per_worker_batch_size`, wrapping round its shard so every batch is full; an epoch is
  `steps_per_epoch` steps (default: ceil(shard / batch), dtrain's);
- the random_crop/random_flip/zero_padding2d layers' augmentation is done on the batch (pad,
  random crop, horizontal flip per example); in the module they are the padding and a centre
  crop, which then cancel;
- BatchNorm2d with the job's epsilon and PyTorch's momentum 1 - Keras's, on each rank's own
  batch (DDP broadcasts rank 0's running statistics);
- SGD with the job's momentum and nesterov (PyTorch's form, v = m v + g), Keras 3's decoupled
  weight_decay (w -= w wd lr before each update, every weight), the job's cosine decay with its
  linear warm-up (Keras's CosineDecay), every rate times N with `scale_learning_rate`;
- cross-entropy on logits (label_smoothing if the job has it); gradients averaged by DDP.
After each epoch the ranks evaluate the test split between them (eval mode, shared by halves)
and rank 0 prints a JSON line: {"epoch", "loss", "val_loss", "val_accuracy", "seconds"}.
Asserts nothing; run by scripts/bench-resnet.sh beside dtrain. Needs Debian's python3-torch.
"""
import argparse
import datetime
import json
import math
import os
import socket
import sys
import time

import numpy as np
import torch
import torch.distributed as dist
import torch.multiprocessing as mp
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "examples",
                                "pytorch"))
import load_dtrain_model as loader  # noqa: E402


class FreshBuilder(loader.Builder):
    """The loader's builder, with each tensor drawn as its layer's initializer would."""

    def __init__(self, spec, tensors, path, graph):
        super().__init__(spec, {}, path, graph)
        self.by_name = {}
        for i, layer in enumerate(graph.layers):
            self.by_name[graph.names[i]] = layer

    def take(self, name, shape):
        layer = self.by_name[self.prefix[:-1]]
        if name in ("bias", "beta", "moving_mean"):
            return torch.zeros(shape)
        if name in ("gamma", "moving_variance"):
            return torch.ones(shape)
        assert name == "kernel", name
        if len(shape) == 4:  # conv2d: [out, in, kh, kw]
            fan_in = shape[1] * shape[2] * shape[3]
            fan_out = shape[0] * shape[2] * shape[3]
        else:  # dense: [in, out]
            fan_in, fan_out = shape
        initializer = layer.get("kernel_initializer", "glorot_uniform")
        if initializer == "glorot_uniform":
            limit = math.sqrt(6.0 / (fan_in + fan_out))
            return torch.empty(shape).uniform_(-limit, limit)
        if initializer == "he_normal":
            # Keras: a normal truncated at 2 deviations, widened so its deviation is the target.
            std = math.sqrt(2.0 / fan_in) / 0.87962566103423978
            return torch.nn.init.trunc_normal_(torch.empty(shape), std=std, a=-2 * std,
                                               b=2 * std)
        raise SystemExit(f"resnet_torch.py: layer {self.prefix[:-1]}: initializer "
                         f"{initializer!r} not drawn here")


def build(spec):
    loader.Builder = FreshBuilder  # build_model constructs the module's builder by this name
    model, softmax = loader.build_model(spec, {}, "fresh")
    if softmax:
        raise SystemExit("resnet_torch.py: the model must end in logits (from_logits)")
    return model.train()


def augmentation(layers):
    """(pad, crop, flip) of the job's input layers: zero_padding2d then random_crop, and a
    random_flip "horizontal"; (0, None, False) where there are none."""
    pad, crop, flip = 0, None, False
    for layer in layers:
        if layer["type"] == "zero_padding2d" and crop is None:
            pad = layer.get("padding", 1)
            if not isinstance(pad, int):
                raise SystemExit("resnet_torch.py: only an integer zero_padding2d")
        elif layer["type"] == "random_crop":
            crop = (layer["height"], layer["width"])
        elif layer["type"] == "random_flip":
            if layer.get("mode") != "horizontal":
                raise SystemExit("resnet_torch.py: only random_flip \"horizontal\"")
            flip = True
    return pad, crop, flip


def augment(x, pad, crop, flip, generator):
    """A batch padded and cropped back to its size at a random offset, and flipped, per
    example. The model's own padding and centre crop then give the batch back unchanged."""
    n, c, h, w = x.shape
    if crop is not None:
        if crop != (h, w):
            raise SystemExit("resnet_torch.py: only a random_crop back to the input's size")
        padded = F.pad(x, (pad, pad, pad, pad))
        top = torch.randint(0, 2 * pad + h - crop[0] + 1, (n,), generator=generator)
        left = torch.randint(0, 2 * pad + w - crop[1] + 1, (n,), generator=generator)
        out = torch.empty(n, c, crop[0], crop[1])
        for k in range(n):
            out[k] = padded[k, :, top[k]:top[k] + crop[0], left[k]:left[k] + crop[1]]
        x = out
    if flip:
        mask = torch.rand(n, generator=generator) < 0.5
        x = torch.where(mask[:, None, None, None], x.flip(3), x)
    return x


def rate(optimizer, step, steps_total, world):
    """The job's learning rate at a step (0-based), times the workers when scaled."""
    schedule = optimizer.get("learning_rate", 0.01)
    scale = world if optimizer.get("scale_learning_rate", False) else 1
    if not isinstance(schedule, dict):
        return schedule * scale
    if schedule["type"] != "cosine_decay":
        raise SystemExit(f"resnet_torch.py: schedule {schedule['type']!r} not implemented")
    initial = schedule["initial_learning_rate"]
    warmup = schedule.get("warmup_steps", 0)
    target = schedule.get("warmup_target", initial)
    alpha = schedule.get("alpha", 0.0)
    decay = schedule.get("decay_steps", steps_total - warmup)
    if step < warmup:
        return scale * (initial + (target - initial) * step / warmup)
    fraction = min(step - warmup, decay) / decay
    start = target if warmup else initial
    return scale * start * ((1 - alpha) * 0.5 * (1 + math.cos(math.pi * fraction)) + alpha)


def rank_main(rank, world, port, args, job):
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    torch.set_num_threads(1)
    dist.init_process_group("gloo", rank=rank, world_size=world,
                            timeout=datetime.timedelta(seconds=600))
    train = job["train"]
    spec, optimizer_spec = train["model"], train["optimizer"]
    if optimizer_spec["type"] != "sgd":
        raise SystemExit("resnet_torch.py: only the sgd optimizer")
    seed = train.get("seed", 42)
    torch.manual_seed(seed)  # every rank draws the same weights
    model = build(spec)
    pad, crop, flip = augmentation(spec["layers"])
    data = args.data or train.get("data", {}).get("dir", loader.DEFAULT_DATA_DIR)
    images = loader.read_idx(loader.idx_path(data, "train-images-idx3-ubyte"), 0x00000803)
    labels = loader.read_idx(loader.idx_path(data, "train-labels-idx1-ubyte"), 0x00000801)
    x_all = torch.from_numpy(images.astype(np.float32) / np.float32(255.0)).unsqueeze(1)
    y_all = torch.from_numpy(labels.astype(np.int64))
    test_x, test_y = loader.load_test_split(".", data, spec["input_shape"])
    half = slice(rank * len(test_x) // world, (rank + 1) * len(test_x) // world)
    test_x, test_y = torch.from_numpy(test_x[half]), torch.from_numpy(test_y[half])

    batch = train["per_worker_batch_size"]
    epochs = args.epochs or train["epochs"]
    shard_size = math.ceil(len(y_all) / world)
    steps = args.steps or train.get("steps_per_epoch") or math.ceil(shard_size / batch)
    ddp = DistributedDataParallel(model)
    sgd = torch.optim.SGD(model.parameters(), lr=0.0, momentum=optimizer_spec.get("momentum", 0),
                          nesterov=optimizer_spec.get("nesterov", False))
    weight_decay = optimizer_spec.get("weight_decay", 0.0)
    smoothing = train["loss"].get("label_smoothing", 0.0)
    generator = torch.Generator().manual_seed(seed * 1000 + rank)

    for epoch in range(epochs):
        started = time.monotonic()
        order = torch.randperm(len(y_all), generator=torch.Generator().manual_seed(seed + epoch))
        shard = order[rank::world]
        ddp.train()
        loss_sum = torch.zeros((), dtype=torch.float64)
        for step in range(steps):
            index = shard[torch.arange(step * batch, (step + 1) * batch) % len(shard)]
            x = augment(x_all[index], pad, crop, flip, generator)
            lr = rate(optimizer_spec, epoch * steps + step, epochs * steps, world)
            for group in sgd.param_groups:
                group["lr"] = lr
            loss = F.cross_entropy(ddp(x), y_all[index], label_smoothing=smoothing)
            sgd.zero_grad()
            loss.backward()
            if weight_decay:
                with torch.no_grad():
                    for p in model.parameters():
                        p.mul_(1 - weight_decay * lr)
            sgd.step()
            loss_sum += loss.detach().double()
        ddp.eval()
        sums = torch.zeros(4, dtype=torch.float64)
        with torch.no_grad():
            for start in range(0, len(test_x), 500):
                logits = model(test_x[start:start + 500])
                y = test_y[start:start + 500]
                sums[0] += F.cross_entropy(logits.double(), y, reduction="sum")
                sums[1] += (logits.argmax(dim=1) == y).sum()
                sums[2] += len(y)
        sums[3] = loss_sum / steps
        dist.all_reduce(sums)
        if rank == 0:
            print(json.dumps({"epoch": epoch + 1, "loss": round(sums[3].item() / world, 4),
                              "val_loss": round(sums[0].item() / sums[2].item(), 4),
                              "val_accuracy": round(sums[1].item() / sums[2].item(), 4),
                              "lr_last": round(lr, 6),
                              "seconds": round(time.monotonic() - started, 1)}), flush=True)
    dist.destroy_process_group()


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("job", help="a dtrain job file")
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--epochs", type=int, help="instead of train.epochs")
    parser.add_argument("--steps", type=int, help="steps per epoch, instead of the job's")
    parser.add_argument("--data", help="the IDX folder, instead of train.data.dir")
    args = parser.parse_args()
    with open(args.job, encoding="utf-8") as f:
        job = json.load(f)
    with socket.socket() as s:  # a free port for the rendezvous
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    mp.spawn(rank_main, args=(args.workers, port, args, job), nprocs=args.workers)


if __name__ == "__main__":
    main()
