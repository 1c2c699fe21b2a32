#!/usr/bin/python3
"""A dtrain language-model job trained by PyTorch DDP: the same graph, data and hyper-parameters.

    gpt_torch.py JOB.json [--workers N] [--seed S]

Builds the job's `train.model` (a sequence model, input_shape [T]) with
examples/pytorch/load_dtrain_model.py's builder, so the two cannot drift, its weights drawn
afresh as dtrain's layers draw them (Keras's initializers): glorot_uniform for dense kernels
(fans in, out) and attention kernels (Keras's fans for three axes (a, b, c): a x b in, a x c
out), uniform(-0.05, 0.05) for token tables, glorot_uniform (length, dim) for a
position_embedding's, ones for gamma, zeros for beta and biases. Trains it with N gloo ranks of
one thread each, as dtrain's N workers:
- the data is the job's `"source": "text"` file: vocabulary the sorted set of its characters
  (or its bytes), the first floor(0.9 n) ids train (validation_split), the rest validate;
- each rank draws `per_worker_batch_size` windows of T ids a step at uniform offsets (every
  window that fits), labels the next T ids; an epoch is `steps_per_epoch` steps;
- cross-entropy over every position, gradients averaged by DDP, clipped by their global norm
  (Keras's: g x clip / max(norm, clip)), then Keras's AdamW: w -= w wd lr on every tensor whose
  dtrain name contains none of exclude_from_weight_decay, then Adam with Keras's epsilon
  (lr_t = lr sqrt(1 - b2^t) / (1 - b1^t), w -= lr_t m / (sqrt(v) + eps));
- the rate: Keras's CosineDecay with its linear warm-up (worker/spec/lr_schedule.cc);
- after each epoch the ranks share every non-overlapping validation window between them.
Rank 0 prints a JSON line an epoch: {"epoch", "loss", "val_loss", "seconds", "val_seconds"}.
Asserts nothing; run by scripts/bench-gpt.sh beside dtrain. Needs Debian's python3-torch.
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


def uniform(shape, limit):
    return torch.empty(shape).uniform_(-limit, limit)


def glorot(shape, fan_in, fan_out):
    return uniform(shape, math.sqrt(6.0 / (fan_in + fan_out)))


class FreshBuilder(loader.Builder):
    """The loader's builder, with each tensor drawn as its layer's initializer would."""

    def __init__(self, spec, tensors, path, graph):
        super().__init__(spec, {}, path, graph)
        self.by_name = {graph.names[i]: layer for i, layer in enumerate(graph.layers)}

    def take(self, name, shape):
        layer = self.by_name[self.prefix[:-1]]
        kind = layer["type"]
        if name in ("bias", "beta") or name.endswith(".bias"):
            return torch.zeros(shape)
        if name == "gamma":
            return torch.ones(shape)
        if name.endswith("embeddings") and kind in ("embedding", "token_and_position_embedding") \
                and not name.startswith("position_embedding"):
            initializer = layer.get("embeddings_initializer", "uniform")
            if initializer not in ("uniform", "random_uniform", "RandomUniform"):
                raise SystemExit(f"gpt_torch.py: {self.prefix[:-1]}: {initializer!r} not drawn")
            return uniform(shape, 0.05)
        if name.endswith("embeddings"):  # a position table: uniform, or position_embedding's
            if kind == "token_and_position_embedding":
                return uniform(shape, 0.05)
            return glorot(shape, shape[0], shape[1])
        initializer = layer.get("kernel_initializer", "glorot_uniform")
        if initializer != "glorot_uniform":
            raise SystemExit(f"gpt_torch.py: {self.prefix[:-1]}: {initializer!r} not drawn here")
        if len(shape) == 3:  # Keras's fans: the first axis is the receptive field
            return glorot(shape, shape[0] * shape[1], shape[0] * shape[2])
        return glorot(shape, shape[0], shape[1])


def build(spec):
    loader.Builder = FreshBuilder  # build_model constructs the module's builder by this name
    model, softmax = loader.build_model(spec, {}, "fresh")
    if softmax:
        raise SystemExit("gpt_torch.py: the model must end in logits (from_logits)")
    named = {id(p): name for name, p in model.dtrain_tensors}
    for name, p in model.named_parameters():
        if id(p) not in named:
            raise SystemExit(f"gpt_torch.py: parameter {name} has no dtrain name")
    return model.train(), named


def rate(schedule, step):
    """Keras's CosineDecay with its warm-up at a step (0-based), as lr_schedule.cc."""
    if not isinstance(schedule, dict):
        return schedule
    if schedule["type"] != "cosine_decay":
        raise SystemExit(f"gpt_torch.py: schedule {schedule['type']!r} not implemented")
    initial = schedule["initial_learning_rate"]
    target = schedule.get("warmup_target")
    warmup = schedule.get("warmup_steps", 0) if target is not None else 0
    if step < warmup:
        return initial + (target - initial) * step / warmup
    start = target if target is not None else initial
    decay = max(schedule["decay_steps"], 1)
    fraction = min(step - warmup, decay) / decay
    alpha = schedule.get("alpha", 0.0)
    return start * ((1 - alpha) * 0.5 * (1 + math.cos(math.pi * fraction)) + alpha)


class KerasAdamW:
    """Keras 3's AdamW on a list of (parameter, decayed) pairs, with global-norm clipping."""

    def __init__(self, params, spec):
        self.params = params
        self.beta_1, self.beta_2 = spec.get("beta_1", 0.9), spec.get("beta_2", 0.999)
        self.epsilon = spec.get("epsilon", 1e-7)
        self.weight_decay = spec.get("weight_decay", 0.004)
        self.clip = spec.get("global_clipnorm")
        self.m = [torch.zeros_like(p) for p, _ in params]
        self.v = [torch.zeros_like(p) for p, _ in params]
        self.t = 0

    @torch.no_grad()
    def step(self, lr):
        self.t += 1
        grads = [p.grad for p, _ in self.params]
        if self.clip:
            norm = torch.sqrt(sum((g.double() ** 2).sum() for g in grads)).item()
            if norm > self.clip:
                for g in grads:
                    g.mul_(self.clip / norm)
        lr_t = lr * math.sqrt(1 - self.beta_2 ** self.t) / (1 - self.beta_1 ** self.t)
        for (p, decayed), g, m, v in zip(self.params, grads, self.m, self.v):
            if decayed:
                p.sub_(p * (self.weight_decay * lr))
            m.mul_(self.beta_1).add_(g, alpha=1 - self.beta_1)
            v.mul_(self.beta_2).addcmul_(g, g, value=1 - self.beta_2)
            p.sub_(lr_t * m / (v.sqrt() + self.epsilon))


def corpus(data):
    """(train ids, validation ids) of the job's text source, as dtrain splits it."""
    if data.get("source") != "text":
        raise SystemExit("gpt_torch.py: only a \"source\": \"text\" job")
    path = data["path"]
    kind = data.get("vocabulary", "characters")
    if kind == "characters":
        with open(path, "rb") as f:
            vocabulary = {"kind": kind, "symbols": sorted(set(f.read().decode("utf-8")))}
    else:
        vocabulary = {"kind": "bytes"}
    ids = loader.text_ids(path, vocabulary)
    train = int(float(len(ids)) * (1 - data.get("validation_split", 0.1)))
    return torch.from_numpy(ids[:train]), torch.from_numpy(ids[train:])


def rank_main(rank, world, port, args, job):
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    torch.set_num_threads(1)
    dist.init_process_group("gloo", rank=rank, world_size=world,
                            timeout=datetime.timedelta(seconds=600))
    train = job["train"]
    spec, optimizer_spec = train["model"], train["optimizer"]
    if optimizer_spec["type"] != "adamw":
        raise SystemExit("gpt_torch.py: only the adamw optimizer")
    seed = args.seed if args.seed is not None else train.get("seed", 42)
    torch.manual_seed(seed)  # every rank draws the same weights
    model, names = build(spec)
    excluded = optimizer_spec.get("exclude_from_weight_decay", [])
    params = [(p, not any(e in names[id(p)] for e in excluded)) for p in model.parameters()]
    train_ids, val_ids = corpus(train["data"])
    length = spec["input_shape"][0]
    windows = (len(val_ids) - 1) // length
    val_x = val_ids[:windows * length].reshape(windows, length)
    val_y = val_ids[1:windows * length + 1].reshape(windows, length)
    share = slice(rank * windows // world, (rank + 1) * windows // world)
    val_x, val_y = val_x[share], val_y[share]

    batch, epochs, steps = train["per_worker_batch_size"], train["epochs"], train["steps_per_epoch"]
    ddp = DistributedDataParallel(model)
    optimizer = KerasAdamW(params, optimizer_spec)
    generator = torch.Generator().manual_seed(seed * 1000 + rank)
    columns = torch.arange(length)
    for epoch in range(epochs):
        started = time.monotonic()
        ddp.train()
        loss_sum = torch.zeros((), dtype=torch.float64)
        for step in range(steps):
            offsets = torch.randint(0, len(train_ids) - length, (batch, 1), generator=generator)
            x, y = train_ids[offsets + columns], train_ids[offsets + columns + 1]
            logits = ddp(x)
            loss = F.cross_entropy(logits.reshape(-1, logits.shape[-1]), y.reshape(-1))
            for p in model.parameters():
                p.grad = None
            loss.backward()
            optimizer.step(rate(optimizer_spec["learning_rate"], epoch * steps + step))
            loss_sum += loss.detach().double()
        seconds = time.monotonic() - started
        started = time.monotonic()
        ddp.eval()
        sums = torch.zeros(3, dtype=torch.float64)
        with torch.no_grad():
            for start in range(0, len(val_x), 64):
                logits = model(val_x[start:start + 64])
                y = val_y[start:start + 64].reshape(-1)
                sums[0] += F.cross_entropy(logits.reshape(len(y), -1).double(), y,
                                           reduction="sum")
                sums[1] += len(y)
        sums[2] = loss_sum / steps
        dist.all_reduce(sums)
        if rank == 0:
            print(json.dumps({"epoch": epoch + 1, "loss": round(sums[2].item() / world, 4),
                              "val_loss": round(sums[0].item() / sums[1].item(), 4),
                              "seconds": round(seconds, 1),
                              "val_seconds": round(time.monotonic() - started, 1)}), flush=True)
    dist.destroy_process_group()


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("job", help="a dtrain job file")
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--seed", type=int, help="instead of train.seed")
    args = parser.parse_args()
    with open(args.job, encoding="utf-8") as f:
        job = json.load(f)
    with socket.socket() as s:  # a free port for the rendezvous
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    mp.spawn(rank_main, args=(args.workers, port, args, job), nprocs=args.workers)


if __name__ == "__main__":
    main()
