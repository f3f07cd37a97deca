"""What a cell's outputs look like in a real kernel: `-o` shows the report once, reprs are one line,
the static figure is in the outputs (what a saved notebook keeps), `%memcheck` help and bad flags."""

from __future__ import annotations

import pytest
from kernel_client import Execution, Kernel

from torchmem_magic.render.static import embedded_figure

pytestmark = [pytest.mark.kernel, pytest.mark.floors]

LOOP = """\
model = torch.nn.Linear(64, 64)
opt = torch.optim.SGD(model.parameters(), lr=0.01)
kept = []
for step in range(60):
    loss = model(torch.randn(8, 64)).pow(2).mean()
    opt.zero_grad(); loss.backward(); opt.step()
    kept.append(model(torch.randn(8, 64)))
"""


def _texts(execution: Execution) -> list[str]:
    """Every text a person sees: streams, displays and the Out value (plain and HTML)."""
    texts = [execution.stdout, execution.stderr]
    for message in execution.of_type("display_data") + execution.of_type("execute_result"):
        data = message["content"]["data"]
        texts += [data.get("text/plain", ""), data.get("text/html", "")]
    return texts


def test_the_kernel_runs_this_checkout(kernel: Kernel) -> None:
    import torchmem_magic

    assert kernel.value("torchmem_magic.__file__") == torchmem_magic.__file__


def test_dash_o_shows_the_report_once_as_the_out_value(kernel: Kernel) -> None:
    execution = kernel.ok(f"%%memwatch -o --interval 20\n{LOOP}")
    assert sum(text.count("memwatch: ok") for text in _texts(execution)) == 2  # the Out value's plain + HTML forms
    (out,) = execution.results()
    assert "memwatch: ok" in out["text/plain"] and "\n" in out["text/plain"]  # pretty display: the long text
    assert "<polyline" in embedded_figure(out["text/html"])
    one_line = kernel.value("repr(_)")
    assert one_line.startswith("<Report: ") and one_line.endswith(">") and "\n" not in one_line
    assert "60 steps" in one_line


def test_the_static_figure_is_in_the_outputs_next_to_the_widget(kernel: Kernel) -> None:
    execution = kernel.ok(f"%%memwatch --interval 20\n{LOOP}")
    html = [m["content"]["data"].get("text/html", "") for m in execution.of_type("display_data")]
    figures = [embedded_figure(h) for h in html if embedded_figure(h)]
    assert len(figures) == 1 and "verdict:" in figures[0] and "<polyline" in figures[0]
    assert any("application/vnd.jupyter.widget-view+json" in m["content"]["data"] for m in execution.of_type("display_data"))


def test_no_plot_in_a_notebook_prints_the_text_and_keeps_the_figure(kernel: Kernel) -> None:
    execution = kernel.ok(f"%%memwatch --no-plot --interval 20\n{LOOP}")
    assert "memwatch: ok" in execution.stdout
    figures = [embedded_figure(m["content"]["data"].get("text/html", "")) for m in execution.of_type("display_data")]
    figures = [f for f in figures if f]
    assert len(figures) == 1 and "<polyline" in figures[0]
    quiet = kernel.ok(f"%%memwatch -q --interval 20\n{LOOP}")
    assert not quiet.of_type("display_data") and "memwatch" not in quiet.stdout


def test_memcheck_result_repr_is_one_line(kernel: Kernel) -> None:
    kernel.ok("x = torch.ones(3, requires_grad=True) * 2\ngrid = {'a b': [x, x * 3]}")
    kernel.ok("r = %memcheck -o grid['a b'][1]")
    one_line = kernel.value("repr(r)")
    assert one_line.startswith("<MemcheckResult: grid['a b'][1] · 1 tensor · ") and one_line.endswith(" retained>")
    assert "grid['a b'][1]: 1 tensor" in kernel.value("str(r)")


def test_memcheck_help(kernel: Kernel) -> None:
    for line in ("%memcheck -h", "%memcheck --help"):
        execution = kernel.ok(line)
        assert "%memcheck [-o] [EXPR" in execution.stdout and "-o " in execution.stdout, execution.stdout
    info = kernel.kc.inspect("%memcheck", 9)
    reply = kernel.kc.get_shell_msg(timeout=30)
    assert reply["content"]["found"] and "%memcheck [-o] [EXPR" in reply["content"]["data"]["text/plain"], info


def test_memcheck_bad_flag_is_a_one_line_usage_error(kernel: Kernel) -> None:
    execution = kernel.execute("%memcheck --bogus x")
    assert execution.status == "error"
    assert execution.stderr.strip().count("\n") == 0, execution.stderr
    assert "UsageError: %memcheck: unknown option --bogus (usage: %memcheck [-o] [EXPR]; see %memcheck?)" in execution.stderr
    assert "Traceback" not in execution.stderr


def test_dash_o_on_a_cell_that_raises_still_shows_the_report(kernel: Kernel) -> None:
    execution = kernel.execute("%%memwatch -o --interval 20\nx = 1\nraise ValueError('boom')")
    assert execution.status == "error" and not execution.results()
    assert any("memwatch: failed" in m["content"]["data"].get("text/plain", "") for m in execution.of_type("display_data"))
