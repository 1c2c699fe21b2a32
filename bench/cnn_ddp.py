#!/usr/bin/python3
"""The main job's CNN as a PyTorch DDP program, for bench/churn.py's torchrun system.

configs/fashion-mnist-2workers.json in PyTorch: conv2d 32 3x3 relu, flatten, dense 128 relu,
dense 10 on Fashion-MNIST (the IDX files, read here), cross-entropy on logits, SGD with momentum,
a cosine decay of the rate over the whole run, the rate scaled by the workers (the file's
`scale_learning_rate`), gradients averaged over gloo. Each rank takes its shard of a per-epoch
shuffle (seed, epoch) as dtrain does, wrapping around the shard so every batch is full. Rank 0
saves a checkpoint at each epoch end (atomically: a temporary file, then a rename); every start
resumes from it, so under `torchrun --max_restarts N` a killed group redoes at most one epoch.
At the end rank 0 writes result.json with the sha256 of the weights.

It is not dtrain's numerics: PyTorch's initialisation and momentum form (v = m v + g; w -= lr v,
where Keras has v = m v - lr g; w += v) differ, so its weights are compared only with its own
runs. Every draw depends on (seed, epoch, step) only, so a run killed and resumed ends with the
weights of one that never stopped.

Logs to stdout: "first step of this run done (CLOCK_MONOTONIC X)" after each start's first step
(as dtrain-worker does at debug level, for recovery times) and one line per epoch.
"""
import argparse
import datetime
import gzip
import hashlib
import json
import math
import os
import struct
import time

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel


def read_idx(path):
    """An IDX file (gzip or not) as a uint8 tensor of its shape."""
    opener = gzip.open if path.endswith(".gz") else open
    with opener(path, "rb") as f:
        data = f.read()
    zero, kind, dims = struct.unpack(">HBB", data[:4])
    if zero != 0 or kind != 0x08:
        raise ValueError(f"{path}: not an IDX file of unsigned bytes")
    shape = struct.unpack(f">{dims}I", data[4:4 + 4 * dims])
    body = bytearray(data[4 + 4 * dims:])
    return torch.frombuffer(body, dtype=torch.uint8).reshape(shape)


def load_train(folder):
    """Training images as float [N, 1, 28, 28] in [0, 1], labels as int64 [N]."""
    def find(name):
        for candidate in (name, name + ".gz"):
            if os.path.exists(os.path.join(folder, candidate)):
                return os.path.join(folder, candidate)
        raise FileNotFoundError(f"{folder}: no {name}[.gz]")

    images = read_idx(find("train-images-idx3-ubyte")).float().div_(255.0).unsqueeze(1)
    labels = read_idx(find("train-labels-idx1-ubyte")).long()
    return images, labels


def make_model():
    return torch.nn.Sequential(
        torch.nn.Conv2d(1, 32, 3), torch.nn.ReLU(), torch.nn.Flatten(),
        torch.nn.Linear(32 * 26 * 26, 128), torch.nn.ReLU(), torch.nn.Linear(128, 10))


def epoch_shard(count, seed, epoch, rank, world):
    """This rank's indices for an epoch: the epoch's shuffle, every world-th from rank."""
    generator = torch.Generator().manual_seed(seed * 1_000_003 + epoch)
    return torch.randperm(count, generator=generator)[rank::world]


def learning_rate(args, world, global_step):
    """Cosine decay from lr x world to 0 over the whole run (Keras's CosineDecay, alpha 0)."""
    total = args.epochs * args.steps
    return args.lr * world * 0.5 * (1 + math.cos(math.pi * min(global_step, total) / total))


def save(path, epoch, model, optimizer):
    """Atomically: a checkpoint cut off mid-write is never read."""
    temporary = f"{path}.tmp"
    torch.save({"epoch": epoch, "model": model.state_dict(),
                "optimizer": optimizer.state_dict()}, temporary)
    with open(temporary, "rb") as f:
        os.fsync(f.fileno())
    os.replace(temporary, path)


def write_result(folder, model, epochs):
    weights = b"".join(p.detach().numpy().tobytes() for p in model.parameters())
    result = {"epochs": epochs, "sha256": hashlib.sha256(weights).hexdigest()}
    temporary = os.path.join(folder, "result.json.tmp")
    with open(temporary, "w") as out:
        json.dump(result, out)
    os.replace(temporary, os.path.join(folder, "result.json"))
    print(f"rank 0: done: {json.dumps(result)}", flush=True)


def parse_args():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dir", required=True, help="checkpoint and result folder")
    parser.add_argument("--data", default="/usr/share/datasets/fashion-mnist")
    parser.add_argument("--epochs", type=int, default=12)
    parser.add_argument("--steps", type=int, default=200, help="steps per epoch")
    parser.add_argument("--batch", type=int, default=64, help="per worker")
    parser.add_argument("--lr", type=float, default=0.04, help="per worker (scaled by world)")
    parser.add_argument("--momentum", type=float, default=0.9)
    parser.add_argument("--seed", type=int, default=42)
    return parser.parse_args()


def main():
    args = parse_args()
    torch.set_num_threads(int(os.environ.get("OMP_NUM_THREADS", "1")))
    os.makedirs(args.dir, exist_ok=True)
    dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=60))
    rank, world = dist.get_rank(), dist.get_world_size()
    images, labels = load_train(args.data)

    torch.manual_seed(args.seed)
    model = make_model()
    optimizer = torch.optim.SGD(model.parameters(), lr=args.lr * world, momentum=args.momentum)
    checkpoint = os.path.join(args.dir, "checkpoint.pt")
    first_epoch = 0
    if os.path.exists(checkpoint):  # every rank reads it before the first all-reduce
        state = torch.load(checkpoint)
        model.load_state_dict(state["model"])
        optimizer.load_state_dict(state["optimizer"])
        first_epoch = state["epoch"]
        print(f"rank {rank}: resumed at epoch {first_epoch}", flush=True)
    ddp = DistributedDataParallel(model)
    loss_function = torch.nn.CrossEntropyLoss()
    first_step_done = False

    for epoch in range(first_epoch, args.epochs):
        started = time.monotonic()
        shard = epoch_shard(len(labels), args.seed, epoch, rank, world)
        loss_sum = torch.zeros(())
        for step in range(args.steps):
            positions = torch.arange(step * args.batch, (step + 1) * args.batch) % len(shard)
            index = shard[positions]
            for group in optimizer.param_groups:
                group["lr"] = learning_rate(args, world, epoch * args.steps + step)
            loss = loss_function(ddp(images[index]), labels[index])
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            loss_sum += loss.detach()
            if not first_step_done:
                first_step_done = True
                print(f"rank {rank}: first step of this run done "
                      f"(CLOCK_MONOTONIC {time.monotonic():.6f})", flush=True)
        if rank == 0:
            save(checkpoint, epoch + 1, model, optimizer)
        mean_loss = loss_sum.item() / args.steps
        print(f"rank {rank}: epoch {epoch + 1}/{args.epochs} loss {mean_loss:.4f}"
              f" {time.monotonic() - started:.2f} s", flush=True)

    if rank == 0:
        write_result(args.dir, model, args.epochs)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
