"""Progress of a long compile, as lines on the ``aot.progress`` logger.

A compile runs several long steps (probing op coverage, measuring op costs, IREE
compiles, timing candidates): each says when it starts, so a compile that takes
a minute is not silent. The CLI prints them (``[aot] ...`` on stderr); a library
user turns them on with ``logging.getLogger("aot.progress").setLevel(logging.INFO)``
and a handler, or ``aot.progress.show()``.
"""

from __future__ import annotations

import logging
import sys
import time

__all__ = ["step", "show"]
log = logging.getLogger("aot.progress")


def step(msg: str, *args) -> None:
    """Say that a long step starts (``%``-style ``args``, formatted only when shown)."""
    log.info(msg, *args)


class _Elapsed(logging.Formatter):
    def __init__(self):
        super().__init__()
        self.t0 = time.perf_counter()

    def format(self, record: logging.LogRecord) -> str:
        return f"[aot] {time.perf_counter() - self.t0:6.1f}s  {record.getMessage()}"


class _Stream(logging.StreamHandler):
    """Writes to ``stream``, or to whatever ``sys.stderr`` is at each line."""

    def __init__(self, stream=None):
        super().__init__(stream or sys.stderr)
        self.fixed = stream is not None

    def emit(self, record: logging.LogRecord) -> None:
        if not self.fixed:
            self.stream = sys.stderr
        super().emit(record)


def show(stream=None) -> None:
    """Print progress lines on ``stream`` (stderr), each with the seconds since this call."""
    if any(getattr(h, "_aot_progress", False) for h in log.handlers):
        return
    h = _Stream(stream)
    h.setFormatter(_Elapsed())
    h._aot_progress = True  # type: ignore[attr-defined]
    log.addHandler(h)
    log.setLevel(logging.INFO)
    log.propagate = False
