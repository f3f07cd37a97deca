"""IPython adapter: parses flags, runs the cell body inside a MemwatchSession, renders the result.

It measures nothing itself. The body runs the way `%%time` runs it (parse, split off the last
expression, exec, eval) with its source registered under the cell's own name, so tracebacks show
"Cell In[N], line L" with the user's lines, and an exception still fails the cell.
"""

from __future__ import annotations

import ast
import os
import sys
from collections.abc import Callable
from typing import Any

from IPython.core.error import UsageError
from IPython.core.magic import Magics, line_cell_magic, line_magic, magics_class
from IPython.core.magic_arguments import argument, magic_arguments, parse_argstring
from IPython.display import HTML, display

from ..agent.rank import adopt_forked
from ..finder.check import check_roots
from ..flight.recorder import FlightRecorder
from ..analysis.forensics import parse_worker_death
from .late_interrupts import drop_late_interrupts
from .late_worker_deaths import keep_later_worker_deaths
from ..finder.leak_finder import LeakSearch
from ..session.lifecycle import cuts_in_anywhere
from ..widgets.live_route import LiveRoute, route_for_kernel
from ..finder.notebook import notebook_roots, recent_sources
from ..core.option_args import from_parsed, option_flags
from ..core.options import SessionOptions
from ..render.static import figure_img_html
from ..render.results import report_long_text
from ..finder.scan.results import Root
from ..session.run import MemwatchSession, active_session
from ..core.step_requests import StopTraining
from ..session.tracebacks import give_lines


def widgets_available(shell: Any) -> bool:
    """True in a Jupyter kernel with ipywidgets and bqplot importable; False in terminal IPython."""
    if getattr(shell, "kernel", None) is None:
        return False
    try:
        import bqplot  # noqa: F401
        import ipywidgets  # noqa: F401
    except ImportError:
        print(
            "torchmem_magic: live figure unavailable (pip install ipywidgets bqplot); showing text",
            file=sys.stderr,
        )
        return False
    return True


def _live_route(shell: Any) -> LiveRoute:
    """Which thread sends the live figure's updates in this kernel (see `live_route`)."""
    try:
        return route_for_kernel(getattr(shell, "kernel", None), sys.modules, os.environ)
    except ValueError as exc:
        raise UsageError(f"%%memwatch: {exc}") from None


def attach_live_figure(shell: Any, session: MemwatchSession, route: LiveRoute | None = None) -> None:
    """The live figure, shown under the running cell and fed from the thread `route` names (by default, the
    one this kernel's widget messages reach the page from); its buttons' clicks go to `session`."""
    from ..widgets.live import LiveFigure
    from ..widgets.update_route import RoutedUpdates

    route = _live_route(shell) if route is None else route
    figure = LiveFigure(session.requests)
    session.listener = RoutedUpdates(figure, session.requests, route)
    display(figure.widget_bundle(), raw=True)


def shell_has_kernel() -> bool:
    """True in a Jupyter kernel (a front end that keeps rich outputs), False in terminal IPython."""
    from IPython import get_ipython

    return getattr(get_ipython(), "kernel", None) is not None


def _current_cell_number(shell: Any) -> int:
    exec_result = getattr(shell.displayhook, "exec_result", None)
    return int(getattr(exec_result, "execution_count", None) or shell.execution_count)


def _option_flags(magic: Callable[..., Any]) -> Callable[..., Any]:
    """The magic's flags for every option of MemwatchOptions, in their order."""
    for flags, keywords in reversed(list(option_flags("magic"))):
        magic = argument(*flags, **keywords)(magic)
    return magic


@magics_class
class MemwatchMagics(Magics):
    """%%memwatch: watch RAM, heap, VRAM and /dev/shm while a training cell runs."""

    def _compile_body(self, line: str, cell: str) -> tuple[Any, Any]:
        """Compile the body for exec plus its last expression (or None) for eval."""
        __tracebackhide__ = True
        shell: Any = self.shell  # IPython's own annotations take source text where it accepts an AST too
        header = f"%%memwatch {line}".rstrip()
        filename = shell.compile.cache(f"{header}\n{cell}", _current_cell_number(shell))
        # a leading blank line stands for the %%memwatch line, so line numbers (also of syntax
        # errors) are the cell's own
        module = shell.compile.ast_parse("\n" + shell.transform_cell(cell), filename=filename)
        module = shell.transform_ast(module)
        last = None
        if module.body and isinstance(module.body[-1], ast.Expr):
            last = shell.compile(ast.Expression(module.body.pop().value), filename, "eval")
        return shell.compile(module, filename, "exec"), last

    def _run_body(self, code: Any, last: Any) -> Any:
        __tracebackhide__ = True
        shell: Any = self.shell
        exec(code, shell.user_global_ns, shell.user_ns)
        return None if last is None else eval(last, shell.user_global_ns, shell.user_ns)

    @magic_arguments()
    @_option_flags
    @argument("--no-plot", action="store_true", help="text report only, no live figure")
    @argument("-o", dest="return_report", action="store_true", help="return the Report (r = _)")
    @argument("--no-record", action="store_true",
              help="keep no flight record on disk (what shows the run after the kernel is killed)")
    @argument("--last", action="store_true",
              help="line magic (%%memwatch --last): show the run of this notebook whose kernel died")
    @line_cell_magic
    def memwatch(self, line: str, cell: str | None = None) -> Any:
        """Run the cell while sampling memory; show a live figure and a report at the end.

        The report is also available as `torchmem_magic.last_report()`. While the cell runs, a flight
        record on disk keeps its curves, so that `%memwatch --last` (or `torchmem_magic.last_crash()`)
        shows them after the kernel was killed.
        """
        __tracebackhide__ = True
        try:
            return self._memwatch(line, cell)
        except BaseException as exc:  # a Ctrl-C's traceback, too, must be one IPython can show
            give_lines(exc)
            if cell is not None:
                keep_later_worker_deaths(self.shell)
            raise
        finally:
            if cell is not None:  # a Ctrl-C from now on finds the cell over: its reply must still go out
                drop_late_interrupts(self.shell)

    def _memwatch(self, line: str, cell: str | None) -> Any:
        __tracebackhide__ = True
        try:
            args = parse_argstring(self.memwatch, line)
        except UsageError as exc:
            raise UsageError(f"%%memwatch: {exc} (see %%memwatch?)") from None
        if cell is None:
            if not args.last:
                raise UsageError("%memwatch: use %%memwatch as a cell magic, or %memwatch --last (see %%memwatch?)")
            return show_last_crash()
        if args.last:
            raise UsageError("%%memwatch: --last is for the line magic, %memwatch --last")
        session = self._new_session(args, cell)
        plot = not (args.quiet or args.no_plot) and widgets_available(self.shell)
        route = _live_route(self.shell) if plot else None
        if active_session() is not None:
            raise UsageError("%%memwatch: another memwatch session is running; nested runs are not supported")
        code, last = self._compiled(line, cell)
        try:
            if route is not None:  # widgets only once the flags and the body are known to be good
                attach_live_figure(self.shell, session, route)
            session.start()  # inside the try: an interrupt right after start still stops it
            value = self._run_body(code, last)
        except StopTraining as exc:  # the Stop button: a clean end, reported, no traceback
            report = self._stop_and_show(session, exc, args, plot)
            return report if args.return_report else None
        except BaseException as exc:
            # the session must stop whatever cuts in (else its thread and hooks stay, and every later cell is
            # refused as nested): a second Ctrl-C, or a second worker's death, can land before stop() has begun
            # (seen at this block's very first line), so the stop is in a `try` of this frame, retried once then
            try:
                self._end(session, exc, args, plot)
            except BaseException as cut:
                if session.report is not None or not cuts_in_anywhere(cut):  # e.g. a Ctrl-C as the report showed
                    raise
                self._end(session, exc, args, plot)
            if session.report is None and isinstance(exc, KeyboardInterrupt):  # while the figure was made or the session started
                print("torchmem_magic: interrupted before the cell ran (while memwatch started); nothing was "
                      "measured", file=sys.stderr)
                raise exc.with_traceback(None) from None  # its frames (the start's scan) hold user objects
            del session  # IPython keeps the traceback, with this frame: not the session (last_report() has its report)
            raise
        try:
            report = self._end(session, None, args, plot)
        except BaseException as cut:  # as the body ended, before stop() took over: it ends the cell
            if session.report is not None or not cuts_in_anywhere(cut):
                raise
            self._end(session, cut, args, plot)
            raise
        if args.return_report:
            if value is not None:
                display(value)
            return report
        return value

    def _new_session(self, args: Any, cell: str) -> MemwatchSession:
        """The cell's session, with its flight record and its leak finder over the notebook's names."""
        try:
            options = from_parsed(args)  # checked before anything is made
        except ValueError as exc:
            raise UsageError(f"%%memwatch: {exc}") from None
        recorder = None if args.no_record else FlightRecorder(cell)
        shell = self.shell
        try:
            search = None if not options.scan else LeakSearch(lambda: notebook_roots(shell), [cell, *recent_sources(shell)])
            return MemwatchSession(SessionOptions.of(options), search=search, recorder=recorder, rank_agent=adopt_forked)
        except ValueError as exc:
            raise UsageError(f"%%memwatch: {exc}") from None

    def _compiled(self, line: str, cell: str) -> tuple[Any, Any]:
        """The cell's body compiled; a syntax error fails the cell, shown against the cell's line."""
        try:
            return self._compile_body(line, cell)
        except SyntaxError as exc:
            if "'await' outside" in str(exc):
                raise UsageError(
                    "%%memwatch: top-level await is not supported in a %%memwatch cell; "
                    "await inside a function, or run the async part in its own cell"
                ) from None
            raise exc.with_traceback(None) from None

    def _end(self, session: MemwatchSession, exc: BaseException | None, args: Any, plot: bool) -> Any:
        """`_stop_and_show` unless the session never ran; again when torch's SIGCHLD handler raised a
        DataLoader worker's death before stop() had begun (it raises into whatever line runs; the report
        explains the death). The caller retries it once when such a death or a Ctrl-C lands at its first
        line, before its `try`."""
        for attempt in range(4):
            try:
                return self._stop_and_show(session, exc, args, plot) if session.running else session.report
            except Exception as death:
                if attempt == 3 or session.report is not None or parse_worker_death(str(death)) is None:
                    raise
        return session.report

    def _stop_and_show(self, session: MemwatchSession, exc: BaseException | None, args: Any, plot: bool) -> Any:
        """End the session and render its report, also when stop() raises a DataLoader worker's death
        that it saw itself (the report exists and explains it by then)."""
        try:
            return session.stop(exc)
        finally:
            if session.report is not None:
                raising = sys.exc_info()[1]  # stop() itself raising: the cell has no value to show
                returned = args.return_report and all(e is None or isinstance(e, StopTraining) for e in (exc, raising))
                self._show(session.report, args, plot, returned)

    @staticmethod
    def _show(report: Any, args: Any, plot: bool, returned: bool) -> None:
        """Render the report; a rendering failure never hides the cell's own result or exception."""
        if args.quiet or returned:  # -o: the Out value is the one display (a cell that raised has none)
            return

        def render() -> None:
            if plot:
                display(report)
            elif shell_has_kernel():  # --no-plot in a notebook: the text, and the figure a saved notebook keeps
                print(report)
                figure = figure_img_html(report)
                if figure:
                    display(HTML(figure))
            else:  # terminal IPython: the curves as sparklines
                print(report_long_text(report))

        try:
            try:
                render()
            except KeyboardInterrupt:  # another Ctrl-C while it is sent (e.g. a second one after the loop's):
                render()  # the report is what the cell is for; then the interrupt stops the cell
                raise
        except Exception as exc:
            print(f"torchmem_magic: could not render the report ({type(exc).__name__}: {exc})", file=sys.stderr)

    @magic_arguments()
    @argument("-o", dest="return_result", action="store_true", help="return the MemcheckResult (r = _)")
    @argument("expr", nargs="*", metavar="EXPR",
              help="what to check: a name, attribute or subscript (default: the whole user namespace)")
    @line_magic
    def memcheck(self, line: str) -> Any:
        """%memcheck [-o] [EXPR]: the tensors EXPR reaches, the autograd graphs they keep alive,
        what deleting it would free, and the fix. Without EXPR: every user variable plus IPython's
        output cache and last traceback, as a list of holders.
        """
        try:
            return self._memcheck(line)
        except BaseException as exc:  # a Ctrl-C during a long check, too, must show where it stopped
            give_lines(exc)
            raise

    def _memcheck(self, line: str) -> Any:
        parsed = _parse_memcheck_line(line)
        if parsed is None:
            print(_help_text(MemwatchMagics.memcheck))
            return None
        return_result, expr = parsed
        shell: Any = self.shell
        if expr:
            try:
                code = compile(expr, "<memcheck>", "eval")
            except SyntaxError as exc:
                raise UsageError(f"%memcheck: {expr!r} is not an expression ({exc.msg})") from None
            try:
                value = eval(code, shell.user_global_ns, shell.user_ns)
            except NameError as exc:
                raise UsageError(f"%memcheck: {exc}") from None
            except Exception as exc:
                raise UsageError(f"%memcheck: evaluating {expr!r} raised {type(exc).__name__}: {exc}") from None
            roots = [Root(expr, "user", expr, value)]
            del value
        else:
            roots = notebook_roots(shell)
        result = check_roots(expr, roots, recent_sources(shell), namespace=not expr)
        del roots
        if return_result:
            return result
        if getattr(shell, "kernel", None) is not None:
            display(result)
        else:
            print(result)
        return None


HELP_FLAGS = ("-h", "--help")


def show_last_crash(announce: bool = False) -> Any:
    """`%memwatch --last`: the report of this notebook's last run whose kernel died, shown; with
    `announce` (the first `%load_ext` of a kernel) only a record not shown before, and a headline."""
    from ..flight.crashes import last_crash, mark_shown, unshown_crash

    report: Any
    announced = None
    if announce:
        found = unshown_crash()
        if found is None:
            return None
        report, announced = found
        print(
            "torchmem_magic: the kernel of this notebook died while %%memwatch watched it; its record "
            f"(kept in {announced.path.parent} until torchmem_magic.clear_crashes()):",
            file=sys.stderr if not shell_has_kernel() else sys.stdout,
            flush=True,  # before the report, which takes a while to draw
        )
    else:
        report = last_crash()
        if report is None:
            print("torchmem_magic: no run of this notebook ended with its kernel's death (no flight record)")
            return None
    if shell_has_kernel():
        display(report)
    else:
        print(report_long_text(report))
    if announced is not None:  # only once it was shown: an interrupted display shows it again in the next kernel
        mark_shown(announced)
    return None


def _help_text(magic: Any) -> str:
    """A magic's help as `%magic?` shows it (magic_arguments puts the usage in the docstring)."""
    import inspect

    return inspect.cleandoc(magic.__doc__ or "")


def _parse_memcheck_line(line: str) -> tuple[bool, str] | None:
    """Flags first (checked by the magic's argparse), then the expression verbatim: argparse would
    split `x[0, 1]` and strip quotes. None: help was asked for (`-h`)."""
    rest = line.strip()
    flags: list[str] = []
    while rest.startswith("-") and not rest[1:2].isdigit():
        flag, _, tail = rest.partition(" ")
        flags.append(flag)
        rest = tail.strip()
    if any(flag in HELP_FLAGS for flag in flags):
        return None
    try:
        args = parse_argstring(MemwatchMagics.memcheck, " ".join(flags))
    except UsageError as exc:
        problem = str(exc).replace("unrecognized arguments:", "unknown option")
        raise UsageError(f"%memcheck: {problem} (usage: %memcheck [-o] [EXPR]; see %memcheck?)") from None
    return bool(args.return_result), rest
