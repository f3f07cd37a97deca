"""The watched side of a multi-process run: a session inside each rank, streamed to the watcher.

A rank is any process of the watched run that trains: one of the processes a notebook cell forks
(`torch.multiprocessing.start_processes(..., start_method="fork")`, Lightning's `ddp_notebook`,
Accelerate's `notebook_launcher`), or a process of a watched command (`torchrun` workers, a plain
script). Nothing starts until the process makes its first step (an optimizer step, a backward
pass, a DataLoader batch or an outermost module call), so launchers, DataLoader workers and helper
processes cost nothing. The rank's own `MemwatchSession` then samples it, scans its holders (also
in the locals of its training function) and streams all of it; its run ends when the process exits
normally, and a rank that is killed leaves what it streamed up to its last quarter second. A rank
of a multi-node torchrun job also keeps a summary of itself in the job's store, for the watchers of
the other nodes (`publish.py`).
"""

from __future__ import annotations

import atexit
import os
import socket
import sys
import threading
from typing import TYPE_CHECKING, Any

from ..core.options import SessionOptions
from ..stream.protocol import events_message, evidence_fields
from ..ranks.settings import RankSettings
from ..stream.transport import Outbox, RankSender
from ..finder.scan.results import Root
from ..finder.stack_roots import StackRoots, StackSources
from .publish import StorePublishing

if TYPE_CHECKING:
    from ..tracing.hooks import StepClock, TrainingHooks
    from ..session.live_view import LiveView
    from ..render.results import Report
    from ..session.run import MemwatchSession

STREAM_PERIOD_S = 0.25  # a killed rank loses at most this much of its record
DEVICES_PERIOD_S = 2.0  # how often a rank says which CUDA devices it uses


# ----------------------------------------------------------------------------- holders in the training function


def _no_roots() -> list[Root]:
    return []


def script_roots() -> list[Root]:
    """A watched script's global names (`__main__`), not `_private` ones."""
    main = sys.modules.get("__main__")
    namespace = getattr(main, "__dict__", {})
    return [Root(k, "user", k, v) for k, v in list(namespace.items()) if not k.startswith("_")]


def script_sources() -> tuple[str, ...]:
    """The watched script's source, where a holder's fix line is looked for."""
    path = getattr(sys.modules.get("__main__"), "__file__", None)
    try:
        with open(path, encoding="utf-8") as file:  # type: ignore[arg-type]
            return (file.read(),)
    except (OSError, TypeError, ValueError):
        return ()


# ----------------------------------------------------------------------------- the agent


def rank_identity() -> tuple[int | None, int | None]:
    """(rank, local rank) of this process: torch.distributed's when it is set up, else the launcher's
    environment (torchrun sets RANK and LOCAL_RANK); None where neither says."""
    rank = local = None
    dist = sys.modules.get("torch.distributed")
    try:
        if dist is not None and dist.is_available() and dist.is_initialized():
            rank = int(dist.get_rank())
    except Exception:
        rank = None
    for name, value in (("RANK", rank), ("LOCAL_RANK", local)):
        if value is None and os.environ.get(name, "").isdigit():
            if name == "RANK":
                rank = int(os.environ[name])
            else:
                local = int(os.environ[name])
    return rank, local


class RankAgent:
    """One rank's session and its stream to the watcher (the session's live listener)."""

    tick_period_s = STREAM_PERIOD_S
    tick_cpu_share: float | None = None  # streams at its period whatever it costs: what a killed rank loses is bounded

    def __init__(self, settings: RankSettings, publish: bool = False) -> None:
        """`publish`: this process is a rank torchrun started (not one forked from it), so in a
        multi-node job it also keeps its summary in the job's store for the other nodes."""
        self.settings = settings
        self._publish = publish
        self.store: StorePublishing | None = None
        self.sender = RankSender(settings.address)
        self.outbox = Outbox()
        self.session: MemwatchSession | None = None
        self._holder_scans_sent = -1
        self._finished = False
        self._devices_sent_s = -DEVICES_PERIOD_S
        self._offered: dict[str, dict[str, Any]] = {}  # kind -> the latest message of that kind not yet sent
        self._offered_lock = threading.Lock()  # offered on the training thread (hello), sent on the sampler's
        self._inherited_exceptions = (getattr(sys, "last_exc", None), getattr(sys, "last_value", None))

    def start(self, hooks: TrainingHooks | None = None) -> None:
        """Start the rank's session (adopting `hooks` already installed in this process, if given)
        and arrange for its run to end when the process exits."""
        from ..finder.leak_finder import LeakSearch
        from ..session.run import MemwatchSession

        settings = self.settings
        sources = list(settings.sources or script_sources())  # the roots add the functions they meet
        search = None
        if settings.scan:
            roots = StackRoots(settings.roots or _no_roots, StackSources(sources))
            search = LeakSearch(roots, sources, inherited=settings.inherited_scan)
        options = SessionOptions(
            settings.interval_ms, shm_path=settings.shm_path, watch_ranks=False, keep_scanned_holders=True,
            guard=settings.guard,
        )
        self.session = MemwatchSession(
            options, search=search, listener=self, relay_to=self.outbox, rank_agent=adopt_forked, adopt_hooks=hooks
        )
        view = self.session.start().view
        assert view is not None
        limit = view.ram_limit
        identity = self._identity()
        if self._publish:
            self.store = StorePublishing.for_rank(os.environ, identity["rank"], identity["local_rank"])
        self._offer({
            "k": "hello", "pid": os.getpid(), "host": socket.gethostname(), **identity,
            "started_wall_s": view.started_wall_s, "interval_s": view.interval_s,
            "ram_limit_bytes": limit.limit_bytes, "ram_limit_source": limit.source,
            "heap_available": view.heap_available,
            **({} if self.store is None else {"job": self.store.job.fields()}),
        })
        if self.store is not None:
            self.store.start()
        self._send_offered()
        atexit.register(self.finish)
        try:  # a multiprocessing child ends with os._exit(): atexit never runs there, its finalizers do
            from multiprocessing import util

            util.Finalize(None, self.finish, exitpriority=100)
        except Exception:
            pass

    @staticmethod
    def _identity() -> dict[str, Any]:
        rank, local = rank_identity()
        return {"rank": rank, "local_rank": local}

    def _offer(self, message: dict[str, Any]) -> None:
        """A message that says a whole state (who the rank is, its devices, its holders): the latest of
        each kind is kept until it is delivered, so a full watcher socket delays it, never loses it."""
        with self._offered_lock:
            self._offered.pop(message["k"], None)
            self._offered[message["k"]] = message

    def _send_offered(self, patiently: bool = False) -> bool:
        """Send the offered messages in the order they were offered; False when one could not go out."""
        with self._offered_lock:
            pending = list(self._offered.values())
        for message in pending:
            sent = self.sender.send_patiently(message) if patiently else self.sender.send(message)
            if not sent:
                return False
            with self._offered_lock:
                if self._offered.get(message["k"]) is message:
                    del self._offered[message["k"]]
        return True

    # the session's listener: runs on the rank's sampler thread
    def on_tick(self, view: LiveView) -> None:
        if view.elapsed_s - self._devices_sent_s >= DEVICES_PERIOD_S:
            self._devices_sent_s = view.elapsed_s
            uuids = view.device_uuids()
            if uuids:
                self._offer({"k": "devices", "pid": os.getpid(), "cuda": uuids})
        tracker_scans = view.holder_scans_so_far
        if tracker_scans != self._holder_scans_sent:
            self._holder_scans_sent = tracker_scans
            series, suspects = view.holders_so_far()
            self._offer({
                "k": "holders", "pid": os.getpid(),
                "series": {name: [list(p) for p in points] for name, points in series.items()},
                "suspects": [s.to_dict() for s in suspects],
            })
        if self._send_offered():
            self._flush(view)
        if self.store is not None:
            self.store.on_tick(view)

    def on_finish(self, view: LiveView, report: Report) -> None:
        pass  # `finish` sends the rest once the report (and so the evidence) exists

    def _events_message(self, view: LiveView, events: list[Any]) -> dict[str, Any]:
        return events_message(
            os.getpid(), view.clock, view.clock_counts, view.elapsed_s, self.outbox.dropped, events,
            **self._identity(),
        )

    def _flush(self, view: LiveView) -> None:
        """Send the queued events, a datagram of up to 200 at a time; what does not go out waits."""
        while len(self.outbox):
            events = self.outbox.take()
            if not self.sender.send(self._events_message(view, events)):
                self.outbox.put_back(events)
                return

    def _own_exception(self) -> BaseException | None:
        """A script's unhandled exception: printed before exit handlers run, and left in sys.last_*
        (one a forked rank inherited from the notebook's earlier cells is not its own)."""
        for name in ("last_exc", "last_value"):
            value = getattr(sys, name, None)
            if isinstance(value, BaseException) and all(value is not seen for seen in self._inherited_exceptions):
                return value
        return None

    def finish(self) -> None:
        """End the rank's run (idempotent): stop its session, send the rest of the stream and the evidence."""
        if self._finished or self.session is None:
            return
        self._finished = True
        session = self.session
        try:
            session.stop(self._own_exception())
        finally:
            if self.store is not None:  # first: the other nodes' watchers may be about to lose the store
                self.store.finish(session.report)
            delivered = self._send_offered(patiently=True)
            view = session.view
            while len(self.outbox) and delivered and view is not None:  # the last rows (at most 2 s when the watcher lags)
                delivered = self.sender.send_patiently(self._events_message(view, self.outbox.take()))
            if session.evidence is not None and delivered:
                self.sender.send_patiently({
                    "k": "final", "pid": os.getpid(), **self._identity(),
                    "evidence": evidence_fields(session.evidence), "dropped": self.outbox.dropped,
                })
            self.sender.close()


_agent: tuple[int, RankAgent] | None = None  # (pid, agent) of this process, once it trains


def adopt_forked(settings: RankSettings, hooks: TrainingHooks, clock: StepClock | None) -> None:
    """A watched process's hooks fired in a process forked from it: start watching that process as a
    rank, unless it is a DataLoader worker (which never counts as a rank).

    The forked process inherited the hooks (they live in torch's hook tables and patched classes);
    its own session adopts them instead of installing new ones, so nothing is added to a hook table
    while torch iterates it."""
    global _agent
    if _agent is not None and _agent[0] == os.getpid():
        return
    try:
        from torch.utils.data import get_worker_info

        if get_worker_info() is not None:
            hooks.active = False  # this worker's copy only
            return
    except Exception:
        return
    from ..session.run import forget_inherited_sessions

    forget_inherited_sessions()
    agent = RankAgent(settings)
    _agent = (os.getpid(), agent)
    agent.start(hooks)
    if clock is not None and agent.session is not None:
        agent.session.tick(clock)
