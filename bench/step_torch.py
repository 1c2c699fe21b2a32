"""The tutorial CNN's training step in PyTorch (CPU build), for comparison with bench/step_bench.

Same model, loss, optimizer, batch and thread count as step_bench; prints one row in its format.
Run by scripts/bench-step.sh; needs Debian's python3-torch. Asserts nothing.
"""
import sys
import time

import torch


def main():
    batch, threads, steps = int(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3])
    torch.set_num_threads(threads)
    torch.manual_seed(0)
    model = torch.nn.Sequential(
        torch.nn.Conv2d(1, 32, 3), torch.nn.ReLU(), torch.nn.Flatten(),
        torch.nn.Linear(32 * 26 * 26, 128), torch.nn.ReLU(), torch.nn.Linear(128, 10))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    loss_fn = torch.nn.CrossEntropyLoss()
    images = torch.rand(batch, 1, 28, 28)
    labels = torch.arange(batch) % 10

    def step():
        optimizer.zero_grad(set_to_none=True)
        loss = loss_fn(model(images), labels)
        loss.backward()
        optimizer.step()

    for _ in range(10):
        step()
    start = time.perf_counter()
    for _ in range(steps):
        step()
    per_step = (time.perf_counter() - start) / steps
    print(f"pytorch-{torch.__version__} {batch} {per_step * 1000:.3f} {batch / per_step:.0f}")


if __name__ == "__main__":
    main()
