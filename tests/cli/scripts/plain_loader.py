"""One process, no torchrun: validation outputs kept with their graphs (no `torch.no_grad()`), and a
DataLoader whose spawned worker runs a module in `__getitem__` (a worker must never become a rank)."""

import time

import torch
from torch.utils.data import DataLoader, Dataset


class Noisy(Dataset):
    def __init__(self) -> None:
        self.augment = torch.nn.Dropout(0.1)  # a module call in the worker: a step clock would tick there

    def __len__(self) -> int:
        return 1280

    def __getitem__(self, index: int) -> torch.Tensor:
        return self.augment(torch.randn(64))


val_outputs = []  # the leak's holder


def train() -> None:
    model = torch.nn.Linear(64, 256)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    loader = DataLoader(Noisy(), batch_size=8, num_workers=1, multiprocessing_context="spawn")
    for x in loader:
        loss = model(x).pow(2).mean()
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        val_outputs.append(model(torch.randn(64, 64)))  # the leak: 64 KiB and a graph a step
        time.sleep(0.005)


if __name__ == "__main__":  # the spawned worker imports this file too
    train()
