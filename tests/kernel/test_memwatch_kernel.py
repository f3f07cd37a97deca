"""%%memwatch in a real ipykernel, driven over ZMQ the way JupyterLab drives it."""

from __future__ import annotations

import re

import pytest
from kernel_client import Execution, Kernel

# the basics run in both kernels of the matrix (ipykernel 7 and 6)
pytestmark = [pytest.mark.kernel, pytest.mark.floors]

ANSI = re.compile(r"\x1b\[[0-9;]*m")

LEAK_FREE_TRAINING = """\
%%memwatch --interval 20
from torch.utils.data import DataLoader, TensorDataset
import time
loader = DataLoader(TensorDataset(torch.randn(40, 8), torch.randn(40, 1)), batch_size=8)  # 5 batches
model = torch.nn.Linear(8, 1)
opt = torch.optim.Adam(model.parameters())
for epoch in range(3):
    for x, y in loader:
        opt.zero_grad()
        torch.nn.functional.mse_loss(model(x), y).backward()
        opt.step()
        time.sleep(0.1)
print("loop done")
"finished"
"""

STATE = "[__import__('threading').active_count(), torchmem_magic.tracing.hooks.installed_hook_count()]"


def _figure_updates(execution: Execution) -> list[int]:
    """Indices of comm_msg updates that carry new curve data."""
    return [
        i for i, m in enumerate(execution.iopub)
        if m["msg_type"] == "comm_msg"
        and m["content"]["data"].get("method") == "update"
        and "y" in m["content"]["data"].get("state", {})
    ]


def _index_of_stdout(execution: Execution, text: str) -> int:
    return next(
        i for i, m in enumerate(execution.iopub)
        if m["msg_type"] == "stream" and text in m["content"].get("text", "")
    )


def _at_cell_line(tb: str, lines: str, source: str | None = None) -> bool:
    """The traceback points at the cell's line (`lines`: a regex, e.g. "5" or "[456]"), in the IPython in use:
    IPython 8.5+ writes `Cell In[n], line L`; 8.0-8.4 write `Input In [n]` and show the line by its arrow
    (`----> L`), or for a syntax error by its source text."""
    if re.search(rf"Cell In\[\d+\], line {lines}\b", tb):
        return True
    if source is not None:
        return re.search(rf"Input In \[\d+\]\n\s+{re.escape(source)}", tb) is not None
    return re.search(rf"Input In \[\d+\], in <module>\n(?:[ \t].*\n)*?-+> {lines}\b", tb) is not None


def _traceback(execution: Execution) -> str:
    assert execution.error is not None
    return ANSI.sub("", "\n".join(execution.error["traceback"]))


@pytest.mark.ipykernel70  # and in ipykernel 7.0.0: the curves stream while the loop runs there too
def test_counts_steps_and_epochs_exactly_and_streams_live(kernel: Kernel) -> None:
    execution = kernel.ok(LEAK_FREE_TRAINING)
    report = kernel.value("torchmem_magic.last_report().to_dict()")
    assert report["steps"] == 15 and report["epochs"] == 3
    assert report["samples"] > 0 and report["status"] == "ok"
    updates = _figure_updates(execution)
    loop_done = _index_of_stdout(execution, "loop done")
    live = [i for i in updates if i < loop_done]
    assert len(live) >= 2, "the figure must update while the loop still runs"
    # iopub and shell are separate sockets, so only the live updates are sure to precede the reply
    assert sum(i < execution.reply_index for i in updates) >= 2
    # bounded payload: every curve update is at most 2,000 points per series
    for i in updates:
        shape = execution.iopub[i]["content"]["data"]["state"]["y"]["shape"]
        assert shape[-1] <= 2000
    # the cell's last expression is displayed as usual, after the report
    assert execution.results() and execution.results()[-1]["text/plain"] == "'finished'"
    html = [m for m in execution.of_type("display_data") if "text/html" in m["content"]["data"]]
    assert html and "memwatch: ok" in html[-1]["content"]["data"]["text/html"]


def test_exception_fails_the_cell_reports_and_cleans_up(kernel: Kernel) -> None:
    before = kernel.value(STATE)
    execution = kernel.execute(
        "%%memwatch --interval 10\n"
        "model = torch.nn.Linear(4, 1); opt = torch.optim.SGD(model.parameters(), lr=0.1)\n"
        "for i in range(5):\n"
        "    opt.zero_grad(); model(torch.randn(2, 4)).sum().backward(); opt.step()\n"
        "raise ValueError('boom at the end')\n"
    )
    assert execution.status == "error"
    assert execution.error["ename"] == "ValueError"
    tb = _traceback(execution)
    assert _at_cell_line(tb, "5") and "raise ValueError('boom at the end')" in tb
    report = kernel.value("torchmem_magic.last_report().to_dict()")
    assert report["status"] == "error" and report["steps"] == 5 and "boom at the end" in report["error"]
    assert kernel.value(STATE) == [before[0], 0]


def test_keyboard_interrupt_stops_the_cell_reports_and_cleans_up(kernel: Kernel) -> None:
    before = kernel.value(STATE)
    execution = kernel.execute(
        "%%memwatch --interval 10\n"
        "import itertools, time\n"
        "model = torch.nn.Linear(4, 1); opt = torch.optim.SGD(model.parameters(), lr=0.1)\n"
        "for step in itertools.count():\n"
        "    opt.zero_grad(); model(torch.randn(2, 4)).sum().backward(); opt.step()\n"
        "    if step == 20:\n"
        "        print('training')\n"
        "    time.sleep(0.01)\n",
        interrupt_when_printed="training",  # the first optimizer alone imports torch._dynamo: seconds
    )
    assert execution.status == "error" and execution.error["ename"] == "KeyboardInterrupt"
    assert _at_cell_line(_traceback(execution), "[4-8]")
    report = kernel.value("torchmem_magic.last_report().to_dict()")
    assert report["status"] == "interrupted" and report["steps"] > 10
    text = [m for m in execution.of_type("display_data") if "memwatch: interrupted" in m["content"]["data"].get("text/plain", "")]
    assert text, "the report renders before the interrupt propagates"
    assert kernel.value(STATE) == [before[0], 0]


#: a busy loop whose jump back to its top has no line number on Python 3.11 (an `if` ends its body), where
#: a Ctrl-C lands once it spins: IPython's formatter fails on a traceback entry without a line
LOOP_JUMPING_BACK_WITHOUT_A_LINE = (
    "x = 0\n"
    "for step in range(10**12):\n"
    "    if step == 1000:\n"
    "        print('looping')  # no flush: it would wait for the kernel's I/O thread\n"
)
LOOP_HAS_A_LINELESS_JUMP = (
    "any(i.opname.startswith('JUMP_BACKWARD') and getattr(i.positions, 'lineno', 0) is None "
    f"for i in __import__('dis').get_instructions(compile({LOOP_JUMPING_BACK_WITHOUT_A_LINE!r}, 'cell', 'exec')))"
)


@pytest.mark.parametrize("front", ["%%memwatch --interval 10", "with torchmem_magic.memwatch():"])
def test_an_interrupt_where_the_loop_has_no_line_number_shows_its_traceback(kernel: Kernel, front: str) -> None:
    if not kernel.value(LOOP_HAS_A_LINELESS_JUMP):
        pytest.skip("this Python gives the loop's jump back a line number: nothing to mend")
    before = kernel.value(STATE)
    indent = "    " if front.startswith("with") else ""
    body = "".join(indent + line + "\n" for line in LOOP_JUMPING_BACK_WITHOUT_A_LINE.splitlines())
    execution = kernel.execute(f"{front}\n{body}", interrupt_when_printed="looping")
    assert "Unexpected exception formatting exception" not in execution.stdout, execution.stdout
    assert execution.status == "error" and execution.error is not None, (execution.status, execution.stderr[-2000:])
    assert execution.error["ename"] == "KeyboardInterrupt"
    tb = _traceback(execution)
    assert _at_cell_line(tb, "3") and re.search(r"-+> 3\s+for step in range\(10\*\*12\)", tb), tb  # the loop's header
    assert kernel.value("torchmem_magic.last_report().status") == "interrupted"
    assert kernel.value(STATE) == [before[0], 0]


def test_dataloader_workers_appear_in_the_report(kernel: Kernel) -> None:
    # each sample takes 5 ms to load, so that a worker lives for many sampling intervals: on a fast
    # machine a worker over a tensor in memory ends its epoch before the sampler's next reading
    kernel.ok(
        "%%memwatch -q --interval 20\n"
        "import time\n"
        "from torch.utils.data import DataLoader, TensorDataset\n"
        "class SlowSamples(TensorDataset):\n"
        "    def __getitem__(self, i):\n"
        "        time.sleep(0.005)\n"
        "        return super().__getitem__(i)\n"
        "loader = DataLoader(SlowSamples(torch.randn(256, 8)), batch_size=16, num_workers=2)\n"
        "model = torch.nn.Linear(8, 1); opt = torch.optim.SGD(model.parameters(), lr=0.1)\n"
        "for epoch in range(2):\n"
        "    for (x,) in loader:\n"
        "        opt.zero_grad(); model(x).sum().backward(); opt.step()\n"
    )
    report = kernel.value("torchmem_magic.last_report().to_dict()")
    assert report["steps"] == 32 and report["epochs"] == 2
    assert report["workers"]["max"] == 2 and report["workers"]["peak"] > 0
    assert report["ram"]["peak"] > report["workers"]["peak"]


@pytest.mark.parametrize(
    "line,message",
    [
        ("--interval 0", "UsageError: %%memwatch: interval must be between 1 and 10000 ms"),
        ("--bogus", "UsageError: %%memwatch: unrecognized arguments: --bogus"),
        ("--interval fast", "UsageError: %%memwatch: interval must be a number of milliseconds, got 'fast'"),
        ("--device tpu", "UsageError: %%memwatch: --device takes 'cuda', 'cuda:N' or 'N'"),
        ("--device cuda:7", "UsageError: %%memwatch: --device cuda:7:"),
    ],
)
def test_bad_flags_give_a_one_line_usage_error(kernel: Kernel, line: str, message: str) -> None:
    kernel.ok("flag_probe = 'untouched'")
    execution = kernel.execute(f"%%memwatch {line}\nflag_probe = 'ran'")
    assert execution.status == "error"
    lines = [l for l in execution.stderr.splitlines() if l.strip()]
    assert len(lines) == 1 and lines[0].startswith(message), execution.stderr
    assert "Traceback" not in execution.stderr and not execution.of_type("error")
    assert not execution.of_type("comm_open")  # no widget is created for a cell that will not run
    assert kernel.value("flag_probe") == "untouched"  # the body did not run


def test_syntax_error_in_the_body_fails_the_cell_at_its_line(kernel: Kernel) -> None:
    execution = kernel.execute("%%memwatch -q\nx = 1\ny = (\n")
    assert execution.status == "error" and execution.error["ename"] == "SyntaxError"
    assert _at_cell_line(_traceback(execution), "3", source="y = (")
    assert kernel.value("torchmem_magic.tracing.hooks.installed_hook_count()") == 0
    awaiting = kernel.execute("%%memwatch -q\nimport asyncio\nawait asyncio.sleep(0)\n")
    assert awaiting.status == "error" and "top-level await is not supported" in awaiting.stderr


def test_no_strong_reference_to_user_tensors_after_the_cell(kernel: Kernel) -> None:
    kernel.ok(
        "%%memwatch -q --interval 5\n"
        "import weakref, gc\n"
        "model = torch.nn.Linear(64, 64); opt = torch.optim.SGD(model.parameters(), lr=0.1)\n"
        "for i in range(10):\n"
        "    opt.zero_grad(); loss = model(torch.randn(32, 64)).sum(); loss.backward(); opt.step()\n"
        "big = torch.ones(4 << 20)\n"
        "refs = [weakref.ref(o) for o in (loss, big, model, opt)]\n"
    )
    assert kernel.value("(gc.collect(), [r() is None for r in refs])[1]") == [False] * 4
    assert kernel.value("(exec('del loss, big, model, opt'), gc.collect(), [r() is None for r in refs])[2]") == [True] * 4


def test_synthetic_leak_of_1mb_per_step(kernel: Kernel) -> None:
    kernel.ok(
        "%%memwatch -q --interval 10\n"
        "model = torch.nn.Linear(8, 8); opt = torch.optim.SGD(model.parameters(), lr=0.1); kept = []\n"
        "for i in range(60):\n"
        "    opt.zero_grad(); model(torch.randn(4, 8)).sum().backward(); opt.step()\n"
        "    kept.append(torch.ones(1 << 18))  # 1 MiB a step\n"
    )
    heap_per_step = kernel.value("torchmem_magic.last_report().to_dict()['heap']['per_step']")
    assert heap_per_step == pytest.approx(1 << 20, rel=0.2)
    kernel.ok("del kept")


def test_script_api_in_a_notebook_names_the_users_holder_not_ipython_internals(kernel: Kernel) -> None:
    kernel.ok(
        "with torchmem_magic.memwatch(10, quiet=True) as w:\n"
        "    model = torch.nn.Linear(64, 64); opt = torch.optim.SGD(model.parameters(), lr=0.1); outs = []\n"
        "    for i in range(20):\n"
        "        opt.zero_grad(); model(torch.randn(8, 64)).sum().backward(); opt.step()\n"
        "        outs.append(model(torch.randn(256, 64)))\n"
    )
    suspects = kernel.value("[(s['name'], s['kind'], s['fix']) for s in w.report.to_dict()['suspects']]")
    assert suspects[0][:2] == ["outs", "autograd-graph"], suspects
    assert "torch.no_grad" in suspects[0][2]
    assert not any(name.startswith("get_ipython") for name, _, _ in suspects), suspects
    kernel.ok("del outs, w")


def test_output_options(kernel: Kernel) -> None:
    quiet = kernel.ok("%%memwatch -q\nx = 1")
    assert not quiet.of_type("display_data") and not quiet.of_type("comm_open") and quiet.stdout == ""
    text = kernel.ok("%%memwatch --no-plot\nx = 2")
    assert text.stdout.startswith("memwatch: ok") and not text.of_type("comm_open")
    returned = kernel.ok("%%memwatch -o -q\n41 + 1")
    assert "memwatch: ok" in returned.results()[-1]["text/plain"]
    assert "42" in returned.of_type("display_data")[-1]["content"]["data"]["text/plain"]
    assert kernel.value("type(_).__name__") == "Report"


def test_unload_removes_the_magic_and_reload_works(fresh_kernel: Kernel) -> None:
    fresh_kernel.ok("%load_ext torchmem_magic")  # loading twice is harmless
    fresh_kernel.ok("%unload_ext torchmem_magic")
    gone = fresh_kernel.execute("%%memwatch\nx = 1")
    assert gone.status == "error" and "memwatch" in (gone.stderr + str(gone.error))
    fresh_kernel.ok("%load_ext torchmem_magic")
    fresh_kernel.ok("%%memwatch -q\nx = 1")
    assert fresh_kernel.value("torchmem_magic.tracing.hooks.installed_hook_count()") == 0


def _unknown_magic(kernel: Kernel, code: str) -> str:
    """The error IPython gives for a magic nobody registered ('UsageError: Line magic function ...')."""
    execution = kernel.execute(code)
    reply = execution.reply["content"]
    assert execution.status == "error" and reply.get("ename") == "UsageError", (code, execution.stderr, reply)
    assert "UsageError" in execution.stderr  # shown as IPython shows misuse: one line, no traceback
    return str(reply.get("evalue"))


def test_unload_removes_memcheck_and_memwatch_and_stops_a_running_session(fresh_kernel: Kernel) -> None:
    fresh_kernel.ok("x = torch.ones(3)\nw = torchmem_magic.memwatch(quiet=True).start()")
    assert fresh_kernel.value("torchmem_magic.session.run.active_session() is w and w.running")
    fresh_kernel.ok("%unload_ext torchmem_magic")
    assert fresh_kernel.value("torchmem_magic.session.run.active_session() is None and not w.running")
    assert fresh_kernel.value("torchmem_magic.tracing.hooks.installed_hook_count()") == 0
    assert fresh_kernel.value(
        "[t.name for t in __import__('threading').enumerate() if t.name == torchmem_magic.tracing.sampler.THREAD_NAME]"
    ) == []
    assert "Line magic function `%memcheck` not found" in _unknown_magic(fresh_kernel, "%memcheck x")
    assert "Line magic function `%memwatch` not found" in _unknown_magic(fresh_kernel, "%memwatch --last")
    assert "Cell magic `%%memwatch` not found" in _unknown_magic(fresh_kernel, "%%memwatch -q\nx = 2")
    fresh_kernel.ok("%load_ext torchmem_magic")  # a second load brings every magic back
    checked = fresh_kernel.ok("%memcheck x").of_type("display_data")
    assert checked and "12 B" in checked[0]["content"]["data"]["text/plain"], checked
    fresh_kernel.ok("%%memwatch -q\nx = 2")
    assert fresh_kernel.value("torchmem_magic.last_report().status") == "ok"


@pytest.mark.cuda
def test_cuda_training_reports_vram(kernel: Kernel) -> None:
    if not kernel.value("torch.cuda.is_available()"):
        pytest.skip("no CUDA device")
    kernel.ok(
        "%%memwatch -q --interval 20\n"
        "model = torch.nn.Linear(1024, 1024).cuda(); opt = torch.optim.Adam(model.parameters()); kept = []\n"
        "for i in range(50):\n"
        "    opt.zero_grad(); loss = model(torch.randn(256, 1024, device='cuda')).sum(); loss.backward(); opt.step()\n"
        "    kept.append(torch.ones(1 << 18, device='cuda'))\n"
    )
    vram = kernel.value("torchmem_magic.last_report().to_dict()['vram']")
    print("VRAM report:", vram)
    assert vram["allocated_end"] > vram["allocated_start"]
    assert vram["per_step"] == pytest.approx(1 << 20, rel=0.2)
    assert vram["reserved_end"] >= vram["allocated_end"] and vram["limit"] > 0
