"""The main job trained by PyTorch in one process, for scripts/bench-worker.sh's CPU-speed table.

What one dtrain worker ("workers": 1) does in that table, in PyTorch at its best: the tutorial
CNN of configs/fashion-mnist-2workers.json on Fashion-MNIST's training split read from the IDX
files (bench/cnn_ddp.py's reader), every epoch a fresh shuffle, STEPS full batches per epoch,
SGD with momentum and the job's cosine decay of the rate set before each step, in float32 or
with the forward pass and the loss under torch.autocast("cpu", dtype=torch.bfloat16). The images
are converted to floats once, before the first epoch, and each batch is gathered from them by
index, so the input costs PyTorch less than a DataLoader would. Prints one line per epoch:
  epoch E samples_per_s S loss L seconds T
Asserts nothing.
  worker_torch.py BATCH STEPS EPOCHS [float32|autocast_bf16] [--data DIR]
"""
import argparse
import contextlib
import math
import os
import sys
import time

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from cnn_ddp import load_train, make_model  # noqa: E402


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("batch", type=int)
    parser.add_argument("steps", type=int, help="steps per epoch")
    parser.add_argument("epochs", type=int)
    parser.add_argument("precision", nargs="?", default="float32",
                        choices=("float32", "autocast_bf16"))
    parser.add_argument("--data", default="/usr/share/datasets/fashion-mnist")
    parser.add_argument("--lr", type=float, default=0.04)
    parser.add_argument("--momentum", type=float, default=0.9)
    parser.add_argument("--seed", type=int, default=42)
    args = parser.parse_args()
    torch.set_num_threads(int(os.environ.get("OMP_NUM_THREADS", "1")))
    images, labels = load_train(args.data)
    torch.manual_seed(args.seed)
    model = make_model()
    optimizer = torch.optim.SGD(model.parameters(), lr=args.lr, momentum=args.momentum)
    loss_function = torch.nn.CrossEntropyLoss()
    total = args.epochs * args.steps

    def autocast():
        if args.precision == "autocast_bf16":
            return torch.autocast("cpu", dtype=torch.bfloat16)
        return contextlib.nullcontext()

    for epoch in range(args.epochs):
        started = time.perf_counter()
        generator = torch.Generator().manual_seed(args.seed * 1_000_003 + epoch)
        order = torch.randperm(len(labels), generator=generator)
        loss_sum = 0.0
        for step in range(args.steps):
            index = order[torch.arange(step * args.batch, (step + 1) * args.batch) % len(order)]
            x, y = images.index_select(0, index), labels.index_select(0, index)
            for group in optimizer.param_groups:  # Keras's CosineDecay, alpha 0
                group["lr"] = args.lr * 0.5 * (1 + math.cos(
                    math.pi * (epoch * args.steps + step) / total))
            optimizer.zero_grad(set_to_none=True)
            with autocast():
                loss = loss_function(model(x), y)
            loss.backward()
            optimizer.step()
            loss_sum += loss.item()
        seconds = time.perf_counter() - started
        print(f"epoch {epoch + 1} samples_per_s {args.steps * args.batch / seconds:.1f} "
              f"loss {loss_sum / args.steps:.4f} seconds {seconds:.3f}", flush=True)


if __name__ == "__main__":
    main()
