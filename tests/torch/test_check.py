"""`%memcheck EXPR` and `memcheck(obj)` are one engine: the same object gives the same result."""

import json
import subprocess
import sys

# In a child process: an InteractiveShell made here would stay IPython's global instance for every
# later test in this process.
SHELL_SCRIPT = r"""
import json
from IPython.core.interactiveshell import InteractiveShell
from traitlets.config import Config

config = Config()
config.HistoryManager.hist_file = ":memory:"
shell = InteractiveShell.instance(config=config)
shell.extension_manager.load_extension("torchmem_magic")
shell.run_cell(
    "import torch\n"
    "model = torch.nn.Linear(64, 64)\n"
    "outs = []\n"
    "for _ in range(5):\n"
    "    outs.append(model(torch.randn(8, 64)))\n",
    store_history=True,
).raise_error()

import torchmem_magic
from torchmem_magic.finder.notebook import recent_sources

from_magic = shell.run_line_magic("memcheck", "-o outs").to_dict()
from_function = torchmem_magic.memcheck(
    shell.user_ns["outs"], name="outs", sources=recent_sources(shell)
).to_dict()
print(json.dumps([from_magic, from_function]))
"""


def test_magic_and_function_give_the_same_result_for_one_object() -> None:
    run = subprocess.run([sys.executable, "-c", SHELL_SCRIPT], capture_output=True, text=True, timeout=120)
    assert run.returncode == 0, run.stderr
    from_magic, from_function = json.loads(run.stdout.strip().splitlines()[-1])
    assert from_magic["tensors"] == 5 and from_magic["graph_tensors"] == 5  # not two empty results
    assert any("outs.append(model(torch.randn(8, 64)))" in line for line in from_magic["advice"])  # fix from the cell
    from_magic.pop("elapsed_s")
    from_function.pop("elapsed_s")
    assert from_magic == from_function
