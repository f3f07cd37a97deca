"""Ranks that `torch.multiprocessing.spawn` starts inside a `memwatch()` block are fresh interpreters; the
environment the block holds (the bootstrap on PYTHONPATH, the watcher's address) makes each a rank of the
report, with its own steps, and is put back once the block ends."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from pathlib import Path

SCRIPT = textwrap.dedent('''
    import json, os, sys
    import torch, torch.multiprocessing as mp
    from torchmem_magic import memwatch

    def work(rank):
        model = torch.nn.Linear(8, 1)
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        for _ in range(150):
            loss = model(torch.randn(4, 8)).pow(2).mean()
            opt.zero_grad(); loss.backward(); opt.step()

    if __name__ == "__main__":
        before = dict(os.environ)
        with memwatch(20, quiet=True) as watch:
            mp.spawn(work, nprocs=2)
        ranks = [(r.rank, r.steps) for r in (watch.report.ranks or [])]
        print(json.dumps({"ranks": ranks, "environ_same": dict(os.environ) == before}))
''')


def test_ranks_spawned_inside_the_block_are_watched(tmp_path: Path) -> None:
    script = tmp_path / "spawned.py"
    script.write_text(SCRIPT)
    done = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=180, cwd=tmp_path)
    assert done.returncode == 0, done.stderr[-3000:]
    seen = json.loads(done.stdout.strip().splitlines()[-1])
    assert seen["ranks"] == [[0, 150], [1, 150]], seen
    assert seen["environ_same"], seen
