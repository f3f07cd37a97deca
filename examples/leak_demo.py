"""Headless demo: %%memwatch in a plain terminal IPython shell, over a classic leak.

An "eval" forward pass without `torch.no_grad()` whose outputs are kept in a list: every step
keeps its autograd graph and saved activations alive. Run with `make demo`.
"""

from IPython.terminal.interactiveshell import TerminalInteractiveShell

SETUP = """\
%load_ext torchmem_magic
import torch
torch.manual_seed(0)
model = torch.nn.Sequential(torch.nn.Linear(512, 512), torch.nn.ReLU(), torch.nn.Linear(512, 10))
optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
val_outputs = []
"""

TRAIN = """\
%%memwatch --interval 50
for step in range(200):
    loss = model(torch.randn(256, 512)).logsumexp(dim=1).mean()
    optimizer.zero_grad()
    loss.backward()
    optimizer.step()
    val_outputs.append(model(torch.randn(256, 512)))   # no torch.no_grad(): keeps the graph
len(val_outputs)
"""

REPORT = "torchmem_magic.last_report().to_dict()['heap']"


def main() -> None:
    shell = TerminalInteractiveShell.instance()
    for cell in (SETUP, TRAIN, "import torchmem_magic", REPORT):
        print("\n".join(f"In : {line}" if i == 0 else f"...: {line}" for i, line in enumerate(cell.splitlines())))
        result = shell.run_cell(cell, store_history=True)
        if not result.success:
            raise SystemExit(1)


if __name__ == "__main__":
    main()
