"""A compiled model under the script API and the CI gate, in a process of its own (once `torch.compile` ran in
a process, the forward clock stays off there: the other tests of this process count forward calls): the
gate fails the leaking loop naming its holder and passes the clean one, and across the two blocks dynamo
compiled nothing more than the same loop bare (no graph break, no recompile of ours)."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap

SCRIPT = textwrap.dedent("""
    import json, torch
    from torch._dynamo.utils import counters
    from torchmem_magic import LeakError, assert_no_leak, memwatch
    from torchmem_magic.tracing.hooks import installed_hook_count

    torch.set_num_threads(1)

    def figures():
        return [counters['stats']['unique_graphs'], sum(counters['graph_break'].values()), counters['frames']['ok']]

    def run(model, opt, steps, keep):
        losses = []
        for _ in range(steps):
            loss = model(torch.randn(64, 32)).square().mean()
            opt.zero_grad(); loss.backward(); opt.step()
            losses.append(loss.item())
            if keep:
                keep.append(model(torch.randn(64, 32)))  # a validation output kept with its graph
        return losses

    def fresh():
        torch._dynamo.reset(); counters.clear(); torch.manual_seed(0)
        net = torch.nn.Sequential(torch.nn.Linear(32, 1024), torch.nn.ReLU(), torch.nn.Linear(1024, 1))
        return torch.compile(net, backend='aot_eager'), torch.optim.SGD(net.parameters(), lr=1e-3)

    said = {}
    model, opt = fresh()
    said['bare'] = run(model, opt, 100, None), figures()
    counters.clear()
    said['bare_again'] = run(model, opt, 100, None), figures()

    model, opt = fresh()
    with memwatch(quiet=True) as watch:
        losses = run(model, opt, 100, None)
    said['watched'] = losses, figures()
    said['clock'] = watch.report.clock, watch.report.steps
    counters.clear()
    with assert_no_leak(quiet=True):
        losses = run(model, opt, 100, None)
    said['gated_clean'] = losses, figures()
    history = [None]
    try:
        with assert_no_leak(quiet=True):
            run(model, opt, 200, history)
        said['gated_leak'] = None
    except LeakError as error:
        said['gated_leak'] = str(error).splitlines()[1]
    said['hooks_left'] = installed_hook_count()
    print(json.dumps(said))
""")


def test_compiled_loops_under_memwatch_and_the_gate() -> None:
    done = subprocess.run([sys.executable, "-c", SCRIPT], capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-4000:]
    said = json.loads(done.stdout.strip().splitlines()[-1])
    assert said["watched"] == said["bare"], (said["bare"][1], said["watched"][1])
    assert said["gated_clean"] == said["bare_again"], (said["bare_again"][1], said["gated_clean"][1])
    assert said["gated_clean"][1] == [0, 0, 0]  # the second block ran what the first compiled
    assert said["clock"] == ["optimizer", 100]
    assert said["gated_leak"] is not None and said["gated_leak"].startswith("top holder: history"), said["gated_leak"]
    assert said["hooks_left"] == 0
