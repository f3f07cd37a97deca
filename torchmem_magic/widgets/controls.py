"""Buttons under the live figure: gc + empty_cache, return heap to OS, release notebook caches,
Stop, and the multiprocessing sharing strategy.

All but Stop act on the kernel, not on a run: one row of them (`KernelRow`) serves every figure of
the kernel, beside each figure's own Stop button, so that a cell does not open their models again.

A click is handled wherever the kernel delivers it. While the cell runs that is a kernel subshell
(ipykernel >= 7 with a front end that routes widget messages there, e.g. JupyterLab 4.6), so the
handler only *queues* the action; it runs at the next optimizer-step boundary on the training thread.
Otherwise the click arrives when the cell has ended and acts at once.
"""

from __future__ import annotations

import html
import weakref
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import ipywidgets

from ..session import actions
from ..core.units import format_bytes
from .shared import layout, shared

if TYPE_CHECKING:
    from ..render.results import Report
    from ..core.step_requests import StepRequests


def mid_run_clicks_possible() -> bool:
    """True when this kernel can run a comm message while a cell is busy (kernel subshells)."""
    try:
        from ipykernel.kernelbase import Kernel

        kernel = Kernel.instance() if Kernel.initialized() else None
    except ImportError:
        return False
    return bool(kernel is not None and getattr(kernel, "_supports_kernel_subshells", False))


def _route_to_senders_subshell(widget: ipywidgets.Widget) -> None:
    """Let the kernel deliver this widget's messages to the subshell the front end sent them on.

    ipykernel 7 routes an incoming comm message to the subshell the comm last *published* from (the
    busy main shell, for a widget displayed by the cell), so a click would wait for the cell. Honouring
    the sender's subshell makes it arrive mid-run. Private API: only where it exists (feature-detected).
    """
    comm = getattr(widget, "comm", None)
    if comm is not None and callable(getattr(comm, "_reply_subshell_for", None)):
        comm._reply_subshell_for = lambda data, default: default


class KernelRow:
    """The controls that act on the kernel, not on one run: gc, the heap, the notebook caches, the
    sharing strategy (the process's), the note on when clicks act (the kernel's), and the line that
    says what the last action did. One row serves every live figure of the kernel (each figure shows
    it beside its own Stop button), so a cell does not open their models again; a click acts for the
    figure made last (`owner`): queued into its run while that runs, else at once."""

    def __init__(self) -> None:
        self.owner: weakref.ReferenceType[Controls] | None = None
        self._syncing = False  # the dropdown set to the strategy in force, not by a user
        button_layout, button_style = layout(width="auto"), shared(ipywidgets.ButtonStyle)
        self.gc_button = ipywidgets.Button(description="gc + empty_cache", icon="recycle", layout=button_layout, style=button_style,
                                           tooltip="gc.collect(), and torch.cuda.empty_cache() if CUDA is in use")
        self.trim_button = ipywidgets.Button(description="return heap to OS", layout=button_layout, style=button_style,
                                             tooltip="glibc malloc_trim(0): RSS drops to what is really in use")
        self.release_button = ipywidgets.Button(description="release notebook caches", layout=button_layout, style=button_style,
                                                tooltip="Out/_/__/___ and their hidden copies, the last traceback")
        info = actions.sharing_info()
        self.strategy = ipywidgets.Dropdown(options=list(info.strategies), value=info.strategy,
                                            description="sharing:", layout=layout(width="220px"),
                                            style=shared(ipywidgets.widgets.widget_description.DescriptionStyle))
        text_layout, text_style = layout(), shared(ipywidgets.widgets.widget_string.HTMLStyle)
        self.result = ipywidgets.HTML(_code(str(info)), layout=text_layout, style=text_style)
        self.note = ipywidgets.HTML(
            "<small>&nbsp;clicks act mid-run, at the next step</small>" if mid_run_clicks_possible()
            else "<small>&nbsp;this kernel handles clicks once the cell has finished</small>",
            layout=text_layout, style=text_style,
        )
        self.gc_button.on_click(lambda _: self._act(self._collect))
        self.trim_button.on_click(lambda _: self._act(actions.return_heap_to_os))
        self.release_button.on_click(lambda _: self._act(actions.release_notebook_caches))
        self.strategy.observe(self._on_strategy, names="value")
        if mid_run_clicks_possible():
            for control in (self.gc_button, self.trim_button, self.release_button, self.strategy):
                _route_to_senders_subshell(control)

    @property
    def open(self) -> bool:
        """False once one of its widgets was closed (`Widget.close_all()`): then a new row is made."""
        return all(getattr(w, "comm", None) is not None for w in (self.gc_button, self.trim_button,
                                                                  self.release_button, self.strategy, self.result, self.note))

    def adopt(self, owner: Controls) -> None:
        """`owner`'s figure is the newest: clicks act for it, and the line shows the sharing state now."""
        self.owner = weakref.ref(owner)
        info = actions.sharing_info()
        if self.strategy.value != info.strategy and info.strategy in self.strategy.options:  # set from code since
            self._syncing = True
            try:
                self.strategy.value = info.strategy
            finally:
                self._syncing = False
        self.show(str(info))

    def _owner(self) -> Controls | None:
        return self.owner() if self.owner is not None else None

    def _act(self, action: Callable[[], Any]) -> None:
        """Queued into the newest figure's run while it runs (at its next step), else done now."""
        owner = self._owner()
        requests = owner._requests if owner is not None else None
        if requests is not None and requests.open:
            self.show("queued: runs at the next step")
            requests.request(lambda: self.show(str(action())))
        else:
            self.show(str(action()))

    def _collect(self) -> actions.ActionResult:
        result = actions.collect_garbage()
        owner = self._owner()
        suspects = owner._suspects if owner is not None else ()
        if result.heap_freed < 1 << 20 and suspects:
            held = ", ".join(f"{s.name} ({format_bytes(s.retained_bytes)})" for s in suspects[:3])
            result = actions.ActionResult(**{**result.__dict__, "note": f"{result.note}; still held by {held}"})
        return result

    def _on_strategy(self, change: Any) -> None:
        if self._syncing:
            return
        try:
            info = actions.set_sharing_strategy(change["new"])
        except ValueError as exc:
            self.show(str(exc))
            return
        self.show(f"{info} (applies to DataLoaders created from now on)")

    def show(self, text: str) -> None:
        self.result.value = _code(text)


def _code(text: str) -> str:
    return f"<code>{html.escape(text)}</code>"


_kernel_row: KernelRow | None = None


def kernel_row() -> KernelRow:
    """The kernel's row, made by the first live figure (and again if it was closed)."""
    global _kernel_row
    if _kernel_row is None or not _kernel_row.open:
        _kernel_row = KernelRow()
    return _kernel_row


class Controls:
    """One figure's row: the kernel's buttons (`KernelRow`), its run's Stop button, and the line that
    says what the last action did."""

    def __init__(self, requests: StepRequests | None = None) -> None:
        """`requests`: where clicks go during the run (as `attach`, from the start)."""
        self._requests = requests  # while a run goes on
        self._suspects: tuple[Any, ...] = ()
        row = self.row = kernel_row()
        self.gc_button, self.trim_button, self.release_button = row.gc_button, row.trim_button, row.release_button
        self.strategy, self.result, self.note = row.strategy, row.result, row.note
        self.stop_button = ipywidgets.Button(description="Stop", icon="stop", button_style="danger", disabled=requests is None,
                                             layout=layout(width="auto"), style=shared(ipywidgets.ButtonStyle),
                                             tooltip="end the loop at the next step")
        self.stop_button.on_click(lambda _: self._stop())
        if mid_run_clicks_possible():
            _route_to_senders_subshell(self.stop_button)
        row.adopt(self)
        self.widget = ipywidgets.VBox([
            ipywidgets.HBox(
                [self.gc_button, self.trim_button, self.release_button, self.stop_button, self.strategy, self.note],
                layout=layout(align_items="center", flex_flow="row wrap"),
            ),
            self.result,
        ], layout=layout())

    # --------------------------------------------------------------- session lifecycle
    def attach(self, requests: StepRequests) -> None:
        """Clicks during the run go to `requests`, which the session runs at the next step."""
        self._requests = requests
        self.stop_button.disabled = False

    def finish(self, report: Report) -> None:
        self._requests = None
        self._suspects = report.suspects
        self.stop_button.disabled = True
        info = actions.sharing_info(workers=report.workers.max_count if report.workers else 0)
        if info.recommendation:
            self._show(str(info))

    # --------------------------------------------------------------- actions
    def _stop(self) -> None:
        requests = self._requests
        if requests is not None and requests.open:
            requests.request_stop()
            self._show("stopping at the next step")

    def _show(self, text: str) -> None:
        self.row.show(text)
