"""A small DDP run (gloo, CPU) in which one rank keeps every step's output with its autograd graph.

Run by the command-line tests under `torchrun`. `--holder global` keeps them in a module-level
list, `--holder local` in a list local to `train()`. `--kill-at N` SIGKILLs the leaking rank at step
N (with `--first-attempt-only`, only in torchrun's first attempt: a restart then runs to the end).
`--wait-for PATH --wait-at N`: the leaking rank waits at step N until PATH exists (a test's sign
that it saw what it waited for, while the run was still going). `--print-steps`: the leaking rank
prints a line at each step (a script's own output). `--leak-mib N`: the leaking rank also keeps an
N MiB tensor a step (a leak that reaches a limit soon). `--compile BACKEND`: the DDP model is compiled
(torch.compile with that backend). The leaking rank writes what one kept step costs (and, when killed, how long a step took) to
`--facts`, so the test compares the report with a measurement of the same run.
"""

import argparse
import json
import os
import signal
import time

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel

leaked_outputs = []  # the global holder


def train(args: argparse.Namespace) -> None:
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    torch.manual_seed(rank)
    model = DistributedDataParallel(torch.nn.Linear(256, 256))
    if args.compile:
        model = torch.compile(model, backend=args.compile)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    kept_outputs = []  # the local holder
    started = time.perf_counter()
    for step in range(1, args.steps + 1):
        out = model(torch.randn(64, 256))
        loss = out.pow(2).mean()
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        if rank == args.leak_rank:
            if args.holder == "global":  # the leak: the output and its graph, every step
                leaked_outputs.append(out)
            else:
                kept_outputs.append(out)
            if args.leak_mib:
                leaked_outputs.append(torch.ones(args.leak_mib << 18))  # float32: 4 bytes an element
            if args.print_steps:
                print(f"step {step} done", flush=True)
            if step == args.wait_at and args.wait_for:
                _wait_for(args.wait_for)
            if step == args.kill_at and not (args.first_attempt_only and os.environ.get("TORCHELASTIC_RESTART_COUNT", "0") != "0"):
                _write(args.facts, out, step, (time.perf_counter() - started) / step)
                os.kill(os.getpid(), signal.SIGKILL)
        time.sleep(args.sleep_s)
    if rank == args.leak_rank:
        _write(args.facts, out, args.steps, (time.perf_counter() - started) / args.steps)
    dist.destroy_process_group()


def _wait_for(path: str, timeout_s: float = 120.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not os.path.exists(path) and time.monotonic() < deadline:
        time.sleep(0.05)


def _write(path: str, out: torch.Tensor, steps: int, step_s: float) -> None:
    facts = {"output_bytes": out.nelement() * out.element_size(), "steps": steps, "step_s": step_s}
    with open(path, "w") as file:
        json.dump(facts, file)


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("--holder", choices=("global", "local"), default="global")
    parser.add_argument("--steps", type=int, default=200)
    parser.add_argument("--leak-rank", type=int, default=1)
    parser.add_argument("--kill-at", type=int, default=0)
    parser.add_argument("--first-attempt-only", action="store_true")  # --kill-at in torchrun's first attempt only
    parser.add_argument("--sleep-s", type=float, default=0.005)
    parser.add_argument("--wait-for", default="")
    parser.add_argument("--wait-at", type=int, default=0)
    parser.add_argument("--print-steps", action="store_true")
    parser.add_argument("--leak-mib", type=int, default=0)
    parser.add_argument("--compile", default="")
    parser.add_argument("--facts", required=True)
    train(parser.parse_args())
