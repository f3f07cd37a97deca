"""A small training loop under the script API, its report saved: `saved_run.py PATH [--keep]`.

With `--keep` each step's output is kept with its autograd graph (a leak of ~64 KiB a step)."""

import sys

import torch

import torchmem_magic

path, keep = sys.argv[1], "--keep" in sys.argv
model = torch.nn.Linear(256, 256)
optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
kept_outputs = []
with torchmem_magic.memwatch(quiet=True) as watch:
    for step in range(200):
        out = model(torch.randn(64, 256))
        loss = out.pow(2).mean()
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        if keep:
            kept_outputs.append(out)
watch.report.save(path)
