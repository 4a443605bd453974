"""Source locations of FX nodes: the user's ``file.py:42`` from export stack traces."""

from __future__ import annotations

import os
import re

import torch.fx

__all__ = ["node_location", "frame_location"]

_FRAME = re.compile(r'File "([^"]+)", line ([0-9]+)')
# Frames inside these packages are never the user's line, nor code FX generated (a
# control-flow body's trace ends in its traced graph's ``<eval_with_key>`` code).
_LIBRARY_MARKERS = (os.sep + "torch" + os.sep, os.sep + "aot" + os.sep + "importer" + os.sep,
                    "<eval_with_key>")


def node_location(node: torch.fx.Node) -> str | None:
    """Innermost user frame of the node's stack trace, as ``path:line``; None if unknown.

    torch.export records a Python stack trace per node (``node.meta["stack_trace"]``);
    the innermost frame outside torch itself is the line in the user's model.
    """
    trace = node.meta.get("stack_trace")
    if not trace:
        return None
    frames = _FRAME.findall(trace)
    for path, line in reversed(frames):
        if not any(m in path for m in _LIBRARY_MARKERS):
            return f"{_short(path)}:{line}"
    if frames:
        path, line = frames[-1]
        return f"{_short(path)}:{line}"
    return None


_PACKAGE = os.path.dirname(os.path.dirname(os.path.abspath(__file__))) + os.sep


def frame_location(stack: list) -> str | None:
    """Innermost user frame (outside torch and this package) of a
    ``traceback.extract_stack()`` list, as ``path:line``; None if there is none."""
    for frame in reversed(stack):
        path = os.path.abspath(frame.filename)
        if not path.startswith(_PACKAGE) and not any(m in path for m in _LIBRARY_MARKERS):
            return f"{_short(frame.filename)}:{frame.lineno}"
    return None


def _short(path: str) -> str:
    try:
        rel = os.path.relpath(path)
    except ValueError:
        return path
    return rel if not rel.startswith(".." + os.sep + "..") else path
