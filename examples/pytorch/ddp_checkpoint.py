#!/usr/bin/env python3
"""An ordinary torchrun-style PyTorch DDP program that saves and restores its own checkpoint.

Nothing in it knows dtrain: it reads torchrun's environment through init_process_group's
default env:// (RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT), so it runs the same under
`torchrun --nproc-per-node 2 ddp_checkpoint.py --dir D` and as a `command` of `dtrain launch`.
Every draw depends only on (step, rank), so a run that was killed and resumed from its
checkpoint ends with the same weights, bit for bit, as one that never stopped.
"""
import argparse
import datetime
import hashlib
import json
import os
import time

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel


def batch(step, rank, size=32):
    """This rank's examples of a step: a fixed noisy linear target."""
    generator = torch.Generator().manual_seed(1_000_003 * step + rank)
    x = torch.randn(size, 16, generator=generator)
    target = x @ torch.linspace(-1, 1, 16).unsqueeze(1)
    return x, target + 0.1 * torch.randn(size, 1, generator=generator)


def check_environment():
    """torchrun's variables agree with the process group and with each other."""
    env = os.environ
    rank, world = dist.get_rank(), dist.get_world_size()
    assert int(env["RANK"]) == rank and int(env["WORLD_SIZE"]) == world, env
    assert 0 <= int(env["LOCAL_RANK"]) < int(env["LOCAL_WORLD_SIZE"]) <= world, env
    restarts = int(env.get("TORCHELASTIC_RESTART_COUNT", "0"))
    print(f"rank {rank}/{world}: LOCAL_RANK={env['LOCAL_RANK']} "
          f"MASTER={env['MASTER_ADDR']}:{env['MASTER_PORT']} RESTART_COUNT={restarts} "
          f"MAX_RESTARTS={env.get('TORCHELASTIC_MAX_RESTARTS')} "
          f"RUN_ID={env.get('TORCHELASTIC_RUN_ID')}", flush=True)


def save(path, step, model, optimizer, loss):
    """Atomically: a half-written checkpoint is never read. loss: the last step's, for a run
    that resumes with nothing left to do."""
    temporary = f"{path}.tmp"
    torch.save({"step": step, "model": model.state_dict(),
                "optimizer": optimizer.state_dict(), "loss": loss}, temporary)
    os.replace(temporary, path)


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dir", required=True, help="checkpoint and result folder")
    parser.add_argument("--steps", type=int, default=200)
    parser.add_argument("--save-every", type=int, default=10)
    parser.add_argument("--step-seconds", type=float, default=0.0, help="sleep per step")
    args = parser.parse_args()
    torch.set_num_threads(1)
    os.makedirs(args.dir, exist_ok=True)
    dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=60))
    rank = dist.get_rank()
    check_environment()

    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.Tanh(), torch.nn.Linear(32, 1))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.02, momentum=0.9)
    checkpoint = os.path.join(args.dir, "checkpoint.pt")
    start, last_loss = 0, None
    if os.path.exists(checkpoint):  # every rank reads it before the first all-reduce
        state = torch.load(checkpoint)
        model.load_state_dict(state["model"])
        optimizer.load_state_dict(state["optimizer"])
        start, last_loss = state["step"], state.get("loss")
        print(f"rank {rank}: resumed from step {start}", flush=True)
    ddp = DistributedDataParallel(model)

    for step in range(start, args.steps):
        x, target = batch(step, rank)
        loss = torch.nn.functional.mse_loss(ddp(x), target)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        last_loss = loss.item()
        if rank == 0 and (step + 1) % args.save_every == 0:
            save(checkpoint, step + 1, model, optimizer, last_loss)
        if (step + 1) % 50 == 0:
            print(f"rank {rank}: step {step + 1}/{args.steps} loss {last_loss:.6f}", flush=True)
        time.sleep(args.step_seconds)

    if rank == 0:
        weights = b"".join(p.detach().numpy().tobytes() for p in model.parameters())
        result = {"steps": args.steps, "sha256": hashlib.sha256(weights).hexdigest(),
                  "loss": last_loss}
        with open(os.path.join(args.dir, "result.json.tmp"), "w") as out:
            json.dump(result, out)
        os.replace(os.path.join(args.dir, "result.json.tmp"), os.path.join(args.dir, "result.json"))
        print(f"rank 0: done: {json.dumps(result)}", flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
