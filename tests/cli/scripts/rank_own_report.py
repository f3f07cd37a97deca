"""A watched process that also saves the report its own session assembled, to compare with the one its
watcher rebuilds from the stream. `holder`: a notebook-style global keeps each step's output with its
graph, batches come from two DataLoader workers (their exits are evidence); `guard`: the same leak
under a RAM limit the memory guard stops the loop at.

    python rank_own_report.py {holder,guard} OWN_REPORT.json
"""

import atexit
import json
import os
import sys

import psutil
import torch
from torch.utils.data import DataLoader, TensorDataset

MIB = 1 << 20
mode, own_report_path = sys.argv[1], sys.argv[2]
kept_outputs = []  # the leak's holder


def save_own_report() -> None:
    """Registered before the rank's agent starts (at the first step), so it runs after the agent's end."""
    from torchmem_magic.agent import boot

    session = None if boot._agent is None else boot._agent.session
    report = None if session is None else session.report
    with open(own_report_path, "w", encoding="utf-8") as file:
        json.dump(None if report is None else report.to_dict(), file)


def train(steps: int) -> None:
    model = torch.nn.Linear(256, 1024)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    loader = DataLoader(TensorDataset(torch.randn(steps * 4, 256)), batch_size=4, num_workers=2)
    for (x,) in loader:
        out = model(x)
        loss = out.pow(2).mean()
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        kept_outputs.append(model(x) * 1.0)  # 16 KiB of output and its graph, a step
        if mode == "guard":
            kept_outputs.append(torch.ones(2 * MIB))  # 8 MiB a step: the guard stops it within 300 MiB


if __name__ == "__main__":
    atexit.register(save_own_report)
    if mode == "guard":  # a limit whose 90 % (the guard's share) lies 300 MiB above what the process uses now
        os.environ["TORCHMEM_MAGIC_RAM_LIMIT"] = str(int((psutil.Process().memory_info().rss + 300 * MIB) / 0.9))
    train(steps=150)
