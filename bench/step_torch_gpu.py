#!/usr/bin/env python3
"""The tutorial CNN's training step in PyTorch on a GPU, for scripts/bench-gpu.sh.

Same model, loss and optimizer (SGD 0.01, momentum 0.9, fp32 master weights and momentum) as
dtrain's job, inputs copied each step from pinned host memory, at the precisions dtrain's
step_bench takes:
  float32         fp32 FMA math, TF32 off (as dtrain's cuDNN and cuBLAS calls).
  tf32            fp32 tensors, TF32 on for cuBLAS and cuDNN during that precision's runs only.
  mixed_bfloat16  torch.autocast(bfloat16) around forward and loss.
  mixed_float16   torch.autocast(float16) around forward and loss, with loss scaling: eager and
                  compiled use torch.amp.GradScaler (dynamic; its step syncs with the host once
                  to skip a step with inf/nan gradients). The CUDA graph cannot capture that, so
                  graph mode uses a fixed loss scale of 2**15: backward of loss * 2**15, then the
                  gradients multiplied by 2**-15 inside the graph before SGD; an overflowing
                  step is not detected or skipped (this model's scaled gradients stay finite).
Modes: eager, CUDA graph (the whole step captured with torch.cuda.graph), and torch.compile
(forward compiled; only the --compiled-precisions and --compiled-batches, compiling is slow).
Prints one row per precision, mode and batch: framework mode precision batch ms_per_step
samples_per_s; a run that fails prints a '#' line and the script goes on. With --floor, prints
instead the step floor from FLOPs and bytes at this GPU's measured rates. Asserts nothing.
"""
import argparse
import contextlib
import sys
import time
import warnings

import torch
import torch.nn as nn

PRECISIONS = ("float32", "tf32", "mixed_bfloat16", "mixed_float16")
AUTOCAST_DTYPES = {"mixed_bfloat16": torch.bfloat16, "mixed_float16": torch.float16}
MATMUL_DTYPES = {"float32": torch.float32, "tf32": torch.float32,
                 "mixed_bfloat16": torch.bfloat16, "mixed_float16": torch.float16}
GRAPH_LOSS_SCALE = 2.0 ** 15


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


@contextlib.contextmanager
def tf32_math(enabled):
    """TF32 for cuBLAS and cuDNN set to `enabled` inside, the previous settings restored after."""
    saved = torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32
    torch.backends.cuda.matmul.allow_tf32 = enabled
    torch.backends.cudnn.allow_tf32 = enabled
    try:
        yield
    finally:
        torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32 = saved


def autocast(precision, cache=True):
    """Autocast for a mixed precision, nothing for float32 and tf32."""
    dtype = AUTOCAST_DTYPES.get(precision)
    if dtype is None:
        return contextlib.nullcontext()
    return torch.autocast("cuda", dtype=dtype, cache_enabled=cache)


def grad_scaler():
    if hasattr(torch.amp, "GradScaler"):  # PyTorch 2.3 and later
        return torch.amp.GradScaler("cuda")
    return torch.cuda.amp.GradScaler()


def time_steps(step, steps, images, labels):
    for i in range(10):  # warm-up
        step(images[i % len(images)], labels[i % len(labels)])
    torch.cuda.synchronize()
    started = time.perf_counter()
    for i in range(steps):
        step(images[i % len(images)], labels[i % len(labels)])
    torch.cuda.synchronize()
    return (time.perf_counter() - started) / steps


def eager(batch, steps, precision, compiled=False):
    net = model("cuda")
    opt = torch.optim.SGD(net.parameters(), lr=0.01, momentum=0.9)
    loss_fn = nn.CrossEntropyLoss()
    fwd = torch.compile(net) if compiled else net
    scaler = grad_scaler() if precision == "mixed_float16" else None
    x = torch.empty(batch, 1, 28, 28, device="cuda")
    y = torch.empty(batch, dtype=torch.int64, device="cuda")

    def step(hx, hy):
        x.copy_(hx, non_blocking=True)
        y.copy_(hy, non_blocking=True)
        opt.zero_grad(set_to_none=False)
        with autocast(precision):
            loss = loss_fn(fwd(x), y)
        if scaler is None:
            loss.backward()
            opt.step()
        else:
            scaler.scale(loss).backward()
            scaler.step(opt)
            scaler.update()

    return time_steps(step, steps, *batches(batch, 8))


def graphed(batch, steps, precision):
    net = model("cuda")
    opt = torch.optim.SGD(net.parameters(), lr=0.01, momentum=0.9)
    loss_fn = nn.CrossEntropyLoss()
    scale = GRAPH_LOSS_SCALE if precision == "mixed_float16" else None
    x = torch.zeros(batch, 1, 28, 28, device="cuda")
    y = torch.zeros(batch, dtype=torch.int64, device="cuda")

    def train():  # autocast's weight cache off, as PyTorch's docs ask for graph capture
        with autocast(precision, cache=False):
            loss = loss_fn(net(x), y)
        if scale is None:
            loss.backward()
        else:
            (loss * scale).backward()
            torch._foreach_mul_([p.grad for p in net.parameters()], 1.0 / scale)
        opt.step()

    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):  # warm-up on a side stream, as PyTorch's docs require
        for _ in range(3):
            opt.zero_grad(set_to_none=False)
            train()
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    opt.zero_grad(set_to_none=True)  # backward then writes fresh gradients in every replay
    with torch.cuda.graph(graph):
        train()

    def step(hx, hy):
        x.copy_(hx, non_blocking=True)
        y.copy_(hy, non_blocking=True)
        graph.replay()

    return time_steps(step, steps, *batches(batch, 8))


def step_flops_bytes(batch, precision):
    """FLOPs and bytes one SGD-momentum step must move at least, for the tutorial CNN.

    float32 and tf32: 4-byte activations; per parameter 8 fp32 accesses (fwd read, bwd-data
    read, grad write, and the update's read of w, g, v and write of w, v).
    mixed_bfloat16 and mixed_float16: 2-byte activations (input, logits and loss too); per
    parameter 28 bytes: the 16-bit copy read twice (fwd, bwd-data: 2 x 2), the fp32 grad
    write (4) and the fp32 update of w, g, v (5 x 4). The write of the 16-bit copy (2 bytes,
    at best folded into the update) is not counted, so this floor is a little low.
    """
    conv_out, dense_in, hidden, classes = 26 * 26 * 32, 26 * 26 * 32, 128, 10
    flops = 2 * batch * conv_out * 9 * 2  # conv forward and weight gradient (no input gradient)
    flops += 3 * 2 * batch * (dense_in * hidden + hidden * classes)  # forward, data, weights
    params = 32 * 9 + 32 + dense_in * hidden + hidden + hidden * classes + classes
    if precision in AUTOCAST_DTYPES:
        act_size, weight_bytes = 2, params * (2 * 2 + 4 + 5 * 4)
    else:
        act_size, weight_bytes = 4, params * 4 * (1 + 1 + 1 + 5)
    act_bytes = act_size * batch * (28 * 28 + conv_out * 6 + hidden * 6 + classes * 4)
    return flops, weight_bytes + act_bytes


def matmul_tflops(precision):
    """An 8192^3 matmul's rate in TFLOP/s: fp32 without or with TF32, or bf16/fp16 tensors."""
    dtype = MATMUL_DTYPES[precision]
    reps = 10 if precision == "float32" else 40
    with tf32_math(precision == "tf32"):
        a = torch.rand(8192, 8192, device="cuda", dtype=dtype)
        b = torch.rand(8192, 8192, device="cuda", dtype=dtype)
        for _ in range(3):
            a @ b
        torch.cuda.synchronize()
        t = time.perf_counter()
        for _ in range(reps):
            a @ b
        torch.cuda.synchronize()
    return reps * 2 * 8192 ** 3 / (time.perf_counter() - t) / 1e12


def copy_gbps():
    x = torch.empty(512 * 2 ** 20 // 4, device="cuda")
    y = torch.empty_like(x)
    y.copy_(x)
    torch.cuda.synchronize()
    t = time.perf_counter()
    for _ in range(20):
        y.copy_(x)
    torch.cuda.synchronize()
    return 20 * 2 * x.numel() * 4 / (time.perf_counter() - t) / 1e9


def floor(batches, precisions):
    """Matmul rate per precision and copy bandwidth measured here, and the step floor: the
    larger of the step's FLOPs at that rate and its bytes at that bandwidth."""
    tflops = {p: matmul_tflops(p) for p in precisions}
    bandwidth = copy_gbps()
    rates = ", ".join(f"{p} {r:.1f}" for p, r in tflops.items())
    print(f"# measured here: matmul TFLOP/s {rates}; copy {bandwidth:.0f} GB/s")
    print("floor precision batch gflop_per_step mbytes_per_step ms_per_step samples_per_s")
    for precision in precisions:
        for batch in batches:
            flops, moved = step_flops_bytes(batch, precision)
            seconds = max(flops / (tflops[precision] * 1e12), moved / (bandwidth * 1e9))
            print(f"floor {precision} {batch} {flops / 1e9:.3f} {moved / 1e6:.1f} "
                  f"{seconds * 1e3:.4f} {batch / seconds:.0f}", flush=True)


def run_one(mode, batch, steps, precision):
    if mode == "eager":
        return eager(batch, steps, precision)
    if mode == "graph":
        return graphed(batch, steps, precision)
    if mode == "compiled":
        return eager(batch, steps, precision, compiled=True)
    raise ValueError(f"unknown mode {mode}")


def run_precision(precision, args):
    """Every mode and batch at one precision; a failure ends that mode's batches."""
    for mode in args.modes:
        mode_batches = args.batches
        if mode == "compiled":
            if precision not in args.compiled_precisions:
                continue
            mode_batches = args.compiled_batches or args.batches
        for batch in mode_batches:
            try:
                t = run_one(mode, batch, args.steps, precision)
            except Exception as e:  # torch.compile needs a compiler and Triton
                print(f"# torch {mode} {precision} batch {batch} failed: {type(e).__name__}: "
                      f"{(str(e).splitlines() or [''])[0][:200]}", flush=True)
                break
            print(f"torch {mode} {precision} {batch} {t * 1e3:.4f} {batch / t:.0f}", flush=True)


def parse_args():
    def names(text):
        chosen = [p for p in text.split(",") if p]
        unknown = [p for p in chosen if p not in PRECISIONS]
        if unknown:
            raise argparse.ArgumentTypeError(f"unknown precision(s) {','.join(unknown)}; "
                                             f"choose from {','.join(PRECISIONS)}")
        return chosen

    def numbers(text):
        return [int(b) for b in text.split(",") if b]

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batches", type=numbers, default="64,256,1024")
    parser.add_argument("--steps", type=int, default=300)
    parser.add_argument("--modes", type=lambda s: s.split(","), default="eager,graph,compiled")
    parser.add_argument("--precision", type=names, default=",".join(PRECISIONS),
                        help="comma list of " + ",".join(PRECISIONS) + " (default: all)")
    parser.add_argument("--compiled-precisions", type=names, default="float32,mixed_bfloat16",
                        help="precisions the compiled mode runs (default: %(default)s)")
    parser.add_argument("--compiled-batches", type=numbers, default="",
                        help="batches the compiled mode runs (default: --batches)")
    parser.add_argument("--floor", action="store_true", help="print the FLOP/byte floor only")
    return parser.parse_args()


def main():
    args = parse_args()
    warnings.filterwarnings("ignore", message=".*TF32.*")  # PyTorch 2.9+: allow_tf32 to go
    torch.backends.cudnn.allow_tf32 = False
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.benchmark = True
    if args.floor:
        floor(args.batches, args.precision)
        return 0
    print(f"# torch {torch.__version__}, {torch.cuda.get_device_name(0)}", flush=True)
    print("framework mode precision batch ms_per_step samples_per_s", flush=True)
    for precision in args.precision:
        with tf32_math(precision == "tf32"):
            run_precision(precision, args)
    return 0


if __name__ == "__main__":
    sys.exit(main())
