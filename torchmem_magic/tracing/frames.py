"""Whether a function still runs on its thread, told without keeping its frame (a frame keeps every
local of the user's alive): by the frame's id and code, looked for on the thread's stack as it is now."""

from __future__ import annotations

import sys
import threading
from types import FrameType


class RunningFrame:
    """A frame of a thread, followed by identity only (see the module's docstring)."""

    def __init__(self, frame: FrameType, thread_id: int | None = None) -> None:
        self._frame_id, self._code = id(frame), frame.f_code
        self._thread_id = threading.get_ident() if thread_id is None else thread_id

    def running(self) -> bool:
        """Whether the frame is still on its thread's stack (False once the function returned or raised)."""
        frame: FrameType | None = sys._current_frames().get(self._thread_id)
        while frame is not None:
            if id(frame) == self._frame_id and frame.f_code is self._code:
                return True
            frame = frame.f_back
        return False


def outermost_frame_of(package: str, frame: FrameType | None) -> FrameType | None:
    """The outermost of the frames of `package`'s modules that run from `frame` outwards without a frame of
    another package between them (whatever this package's own frames stand between): where the user's
    code called into that library (`Trainer.train`)."""
    own = __name__.split(".")[0]
    found = None
    while frame is not None:
        module = str(frame.f_globals.get("__name__", ""))
        top = module.split(".")[0]
        if top == package:
            found = frame
        elif top != own and found is not None:
            return found
        frame = frame.f_back
    return found
