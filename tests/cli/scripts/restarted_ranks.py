"""Ranks that train on their own (no process group: torchrun's restart is what is tested, not gloo's):
rank 1 keeps each step's output with its graph, and in torchrun's first attempt it is SIGKILLed at
step 50, so that torchrun (--max-restarts 1) restarts every rank; the second attempt runs to the end."""

import os
import signal
import time

import torch

rank, attempt = int(os.environ["RANK"]), int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0"))
model = torch.nn.Linear(256, 256)
optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
kept_outputs = []
for step in range(1, 201):
    out = model(torch.randn(64, 256))
    loss = out.pow(2).mean()
    optimizer.zero_grad()
    loss.backward()
    optimizer.step()
    if rank == 1:
        kept_outputs.append(out)
        if attempt == 0 and step == 50:
            os.kill(os.getpid(), signal.SIGKILL)
    time.sleep(0.01)
