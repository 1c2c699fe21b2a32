#!/usr/bin/env python3
"""The tutorial CNN's training step in PyTorch on a GPU, for scripts/bench-gpu.sh.

Same model, loss, optimizer (SGD 0.01, momentum 0.9) and fp32 math as dtrain's job (TF32 off,
as dtrain's cuDNN calls use FMA math), inputs copied each step from pinned host memory. Modes:
eager, CUDA graph (the whole step captured with torch.cuda.graph), and torch.compile when it
works here. Prints one row per mode and batch: framework mode batch ms_per_step samples_per_s.
Asserts nothing.
"""
import argparse
import sys
import time

import torch
import torch.nn as nn


def model(device):
    torch.manual_seed(42)
    return nn.Sequential(
        nn.Conv2d(1, 32, 3), nn.ReLU(), nn.Flatten(),
        nn.Linear(26 * 26 * 32, 128), nn.ReLU(), nn.Linear(128, 10)).to(device)


def batches(batch, count):
    g = torch.Generator().manual_seed(1)
    images = torch.rand(count, batch, 1, 28, 28, generator=g).pin_memory()
    labels = torch.randint(0, 10, (count, batch), generator=g, dtype=torch.int64).pin_memory()
    return images, labels


def time_steps(step, steps, images, labels):
    for i in range(10):  # warm-up
        step(images[i % len(images)], labels[i % len(labels)])
    torch.cuda.synchronize()
    started = time.perf_counter()
    for i in range(steps):
        step(images[i % len(images)], labels[i % len(labels)])
    torch.cuda.synchronize()
    return (time.perf_counter() - started) / steps


def eager(batch, steps, compiled=False):
    net = model("cuda")
    opt = torch.optim.SGD(net.parameters(), lr=0.01, momentum=0.9)
    loss_fn = nn.CrossEntropyLoss()
    fwd = torch.compile(net) if compiled else net
    x = torch.empty(batch, 1, 28, 28, device="cuda")
    y = torch.empty(batch, dtype=torch.int64, device="cuda")

    def step(hx, hy):
        x.copy_(hx, non_blocking=True)
        y.copy_(hy, non_blocking=True)
        opt.zero_grad(set_to_none=False)
        loss_fn(fwd(x), y).backward()
        opt.step()

    return time_steps(step, steps, *batches(batch, 8))


def graphed(batch, steps):
    net = model("cuda")
    opt = torch.optim.SGD(net.parameters(), lr=0.01, momentum=0.9)
    loss_fn = nn.CrossEntropyLoss()
    x = torch.zeros(batch, 1, 28, 28, device="cuda")
    y = torch.zeros(batch, dtype=torch.int64, device="cuda")
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):  # warm-up on a side stream, as PyTorch's docs require
        for _ in range(3):
            opt.zero_grad(set_to_none=False)
            loss_fn(net(x), y).backward()
            opt.step()
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    opt.zero_grad(set_to_none=False)
    with torch.cuda.graph(graph):
        loss_fn(net(x), y).backward()
        opt.step()

    def step(hx, hy):
        x.copy_(hx, non_blocking=True)
        y.copy_(hy, non_blocking=True)
        graph.replay()

    return time_steps(step, steps, *batches(batch, 8))


def step_flops_bytes(batch):
    """FLOPs and bytes one SGD-momentum step must move at least, for the tutorial CNN."""
    conv_out, dense_in, hidden, classes = 26 * 26 * 32, 26 * 26 * 32, 128, 10
    flops = 2 * batch * conv_out * 9 * 2  # conv forward and weight gradient (no input gradient)
    flops += 3 * 2 * batch * (dense_in * hidden + hidden * classes)  # forward, data, weights
    params = 32 * 9 + 32 + dense_in * hidden + hidden + hidden * classes + classes
    weight_bytes = 4 * params * (1 + 1 + 1 + 5)  # fwd read, bwd-data read, grad write, w/g/v update
    act_bytes = 4 * batch * (28 * 28 + conv_out * 6 + hidden * 6 + classes * 4)
    return flops, weight_bytes + act_bytes


def floor(batches):
    """Peak fp32 (no TF32) matmul rate and copy bandwidth measured here, and the step floor."""
    a = torch.rand(8192, 8192, device="cuda")
    b = torch.rand(8192, 8192, device="cuda")
    for _ in range(3):
        a @ b
    torch.cuda.synchronize()
    t = time.perf_counter()
    for _ in range(10):
        a @ b
    torch.cuda.synchronize()
    tflops = 10 * 2 * 8192 ** 3 / (time.perf_counter() - t) / 1e12
    x = torch.empty(512 * 2 ** 20 // 4, device="cuda")
    y = torch.empty_like(x)
    y.copy_(x)
    torch.cuda.synchronize()
    t = time.perf_counter()
    for _ in range(20):
        y.copy_(x)
    torch.cuda.synchronize()
    bandwidth = 20 * 2 * x.numel() * 4 / (time.perf_counter() - t) / 1e9
    print(f"# measured here: fp32 matmul {tflops:.1f} TFLOP/s, copy {bandwidth:.0f} GB/s")
    print("floor batch gflop_per_step mbytes_per_step ms_per_step samples_per_s")
    for batch in batches:
        flops, moved = step_flops_bytes(batch)
        seconds = max(flops / (tflops * 1e12), moved / (bandwidth * 1e9))
        print(f"floor {batch} {flops / 1e9:.3f} {moved / 1e6:.1f} {seconds * 1e3:.4f} "
              f"{batch / seconds:.0f}", flush=True)


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--batches", default="64,256,1024")
    parser.add_argument("--steps", type=int, default=300)
    parser.add_argument("--modes", default="eager,graph,compiled")
    parser.add_argument("--floor", action="store_true", help="print the FLOP/byte floor only")
    args = parser.parse_args()
    torch.backends.cudnn.allow_tf32 = False
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.benchmark = True
    if args.floor:
        floor([int(b) for b in args.batches.split(",")])
        return 0
    print(f"# torch {torch.__version__}, {torch.cuda.get_device_name(0)}", flush=True)
    print("framework mode batch ms_per_step samples_per_s", flush=True)
    for mode in args.modes.split(","):
        for batch in [int(b) for b in args.batches.split(",")]:
            try:
                if mode == "eager":
                    t = eager(batch, args.steps)
                elif mode == "graph":
                    t = graphed(batch, args.steps)
                else:
                    t = eager(batch, args.steps, compiled=True)
            except Exception as e:  # torch.compile needs a compiler and Triton
                print(f"# torch {mode} batch {batch} failed: {type(e).__name__}: "
                      f"{str(e).splitlines()[0][:200]}", flush=True)
                break
            print(f"torch {mode} {batch} {t * 1e3:.4f} {batch / t:.0f}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
