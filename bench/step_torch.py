"""The tutorial CNN's training step in PyTorch (CPU build), for comparison with bench/step_bench.

Same model, loss, optimizer, batch and thread count as step_bench; prints one row in its format
(impl batch ms_per_step samples_per_s) with the precision as a fifth column. Precision `float32`
(default) or `autocast_bf16`: the forward pass and the loss under
`torch.autocast("cpu", dtype=torch.bfloat16)` (fp32 weights and optimizer, PyTorch's mixed
precision; the counterpart of dtrain's mixed_bfloat16).
`step_torch.py --info` prints instead one line: the torch version and the BLAS library this
process loaded (from /proc/self/maps: Debian's torch calls the system libblas.so.3, so
LD_LIBRARY_PATH or the libblas.so.3 alternative decides which).
With --job FILE, the model is that dtrain job's instead (built by bench/resnet_torch.py from its
`train.model`, a chain or a graph, weights drawn afresh) with its optimizer's momentum and
nesterov, timed in PyTorch's default layout and in channels_last, and the faster is printed (its
layout as a sixth column): PyTorch at its best on convolutional networks. A language model's job
(input_shape [T]) is built by bench/gpt_torch.py and steps torch.optim.AdamW with the job's
betas and decay, for-loop and foreach, the faster printed.
Run by scripts/bench-step.sh; needs Debian's python3-torch. Asserts nothing.
  step_torch.py BATCH THREADS STEPS [float32|autocast_bf16] [--job FILE]
  step_torch.py --info
"""
import contextlib
import sys
import time

import torch


def loaded_blas():
    """The BLAS shared objects mapped into this process, the library proper first."""
    paths = set()
    with open("/proc/self/maps") as maps:
        for line in maps:
            path = line.split()[-1]
            name = path.rsplit("/", 1)[-1]
            if "blas" in name or "mkl" in name:
                paths.add(path)
    # libopenblas*.so is the code; libblas.so.3 is the alternative's name for it.
    return sorted(paths, key=lambda p: ("openblas" not in p.rsplit("/", 1)[-1], p))


def info():
    torch.ones(8, 8) @ torch.ones(8, 8)  # the BLAS is linked at load; this makes sure
    blas = loaded_blas()
    kind = "none found"
    if blas:
        first = blas[0]
        kind = ("OpenBLAS OpenMP" if "openblas-openmp" in first
                else "OpenBLAS pthread" if "openblas-pthread" in first
                else "OpenBLAS serial" if "openblas-serial" in first
                else "reference BLAS" if "/blas/" in first
                else "other")
    print(f"torch {torch.__version__}; BLAS {kind}: {blas[0] if blas else '-'}; "
          f"oneDNN (mkldnn) {'on' if torch.backends.mkldnn.is_available() else 'off'}")


def main():
    if sys.argv[1:] == ["--info"]:
        info()
        return
    argv = sys.argv[1:]
    job = None
    if "--job" in argv:
        at = argv.index("--job")
        job = argv[at + 1]
        del argv[at:at + 2]
    batch, threads, steps = int(argv[0]), int(argv[1]), int(argv[2])
    precision = argv[3] if len(argv) > 3 else "float32"
    if precision not in ("float32", "autocast_bf16"):
        sys.exit(f"step_torch.py: precision {precision}: float32 or autocast_bf16")
    torch.set_num_threads(threads)
    torch.manual_seed(0)
    if job is None:
        model = torch.nn.Sequential(
            torch.nn.Conv2d(1, 32, 3), torch.nn.ReLU(), torch.nn.Flatten(),
            torch.nn.Linear(32 * 26 * 26, 128), torch.nn.ReLU(), torch.nn.Linear(128, 10))
        optimizer = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
        per_step = time_steps(model, optimizer, (batch, 1, 28, 28), precision, steps,
                              torch.contiguous_format)
        layout = ""
    else:
        import json
        import os
        sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
        import resnet_torch
        with open(job, encoding="utf-8") as f:
            train = json.load(f)["train"]
        if len(train["model"]["input_shape"]) == 1:
            per_step, layout = time_language_model(train, batch, precision, steps)
            print(f"pytorch-{torch.__version__} {batch} {per_step * 1000:.3f} "
                  f"{batch / per_step:.0f} {precision}{layout}")
            return
        h, w, c = train["model"]["input_shape"]
        best = None
        for layout in (torch.contiguous_format, torch.channels_last):
            model = resnet_torch.build(train["model"])
            if layout == torch.channels_last:
                model = model.to(memory_format=torch.channels_last)
            spec = train["optimizer"]
            optimizer = torch.optim.SGD(model.parameters(), lr=0.01,
                                        momentum=spec.get("momentum", 0),
                                        nesterov=spec.get("nesterov", False))
            t = time_steps(model, optimizer, (batch, c, h, w), precision, steps, layout)
            if best is None or t < best[0]:
                best = (t, " channels_last" if layout == torch.channels_last else " nchw")
        per_step, layout = best
    print(f"pytorch-{torch.__version__} {batch} {per_step * 1000:.3f} {batch / per_step:.0f} "
          f"{precision}{layout}")


def time_language_model(train, batch, precision, steps):
    """A language model's step (bench/gpt_torch.py builds it from the job's model): random ids,
    cross-entropy over every position, torch.optim.AdamW with the job's betas and decay, timed
    with its for-loop and its foreach implementation; the faster, and which, as the layout."""
    import gpt_torch
    t = train["model"]["input_shape"][0]
    spec = train["optimizer"]
    best = None
    for foreach in (False, True):
        torch.manual_seed(0)
        model, _ = gpt_torch.build(train["model"])
        optimizer = torch.optim.AdamW(
            model.parameters(), lr=1e-3, betas=(spec.get("beta_1", 0.9), spec.get("beta_2", 0.999)),
            weight_decay=spec.get("weight_decay", 0.004), foreach=foreach)
        seconds = time_steps(model, optimizer, (batch, t), precision, steps,
                             torch.contiguous_format, ids=True)
        if best is None or seconds < best[0]:
            best = (seconds, " adamw_foreach" if foreach else " adamw_for_loop")
    return best


def time_steps(model, optimizer, shape, precision, steps, layout, ids=False):
    """Seconds per training step (cross-entropy on logits, the optimizer's update), after 10."""
    loss_fn = torch.nn.CrossEntropyLoss()
    if ids:  # a language model: token ids in, a label per position
        images = torch.randint(0, 64, shape)
        labels = torch.randint(0, 64, shape).view(-1)
    else:
        images = torch.rand(*shape).contiguous(memory_format=layout)
        labels = torch.arange(shape[0]) % 10

    def autocast():
        if precision == "autocast_bf16":
            return torch.autocast("cpu", dtype=torch.bfloat16)
        return contextlib.nullcontext()

    def step():
        optimizer.zero_grad(set_to_none=True)
        with autocast():
            out = model(images)
            loss = loss_fn(out.reshape(labels.shape[0], -1), labels)
        loss.backward()
        optimizer.step()

    for _ in range(10):
        step()
    start = time.perf_counter()
    for _ in range(steps):
        step()
    return (time.perf_counter() - start) / steps

if __name__ == "__main__":
    main()
