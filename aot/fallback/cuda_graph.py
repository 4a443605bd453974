"""Replay an ATen region as one CUDA graph: the launches eager PyTorch pays per op, paid once.

Shapes are static (``torch.export`` specialised them), so a group's members
launch the same kernels on every call. After one eager call (which lets cuDNN
and cuBLAS set up their workspaces) the group is captured once with
``torch.cuda.graph``; later calls copy the run-time inputs into the captured
input buffers and replay. Constant operands (weights baked into the program)
are captured in place: IREE keeps them at the same address, which is checked
on every call (a different address means a recapture). Results are cloned out
of the graph's pool, because a later replay overwrites it while the caller may
still hold them. A group whose ops cannot be captured (a host synchronisation
inside, say) runs eagerly from then on, with a warning.
"""

from __future__ import annotations

import warnings
from typing import Callable

import torch

__all__ = ["GraphedRegion"]


class GraphedRegion:
    """``run(tensors) -> list of tensors``, replayed from a CUDA graph after the first call.

    Args:
        run: runs the members eagerly on a list of input tensors.
        constant: per input, True when it is a constant of the program.
        name: for the warning when capture fails.
    """

    def __init__(self, run: Callable[[list], list], constant: list[bool], name: str):
        self.run, self.constant, self.name = run, constant, name
        self.calls = 0
        self.graph = None
        self.failed = False
        self.static_in: list = []
        self.static_out: list = []
        self.ptrs: list = []

    def __call__(self, tensors: list) -> list:
        self.calls += 1
        if self.failed or self.calls == 1:
            return self.run(tensors)
        if self.graph is None or any(c and t.data_ptr() != p for c, t, p in
                                     zip(self.constant, tensors, self.ptrs)):
            if not self._capture(tensors):
                return self.run(tensors)
        else:
            for c, s, t in zip(self.constant, self.static_in, tensors):
                if not c:
                    s.copy_(t)
        self.graph.replay()
        return [o.clone() for o in self.static_out]

    def _capture(self, tensors: list) -> bool:
        self.static_in = [t if c else t.clone() for c, t in zip(self.constant, tensors)]
        self.ptrs = [t.data_ptr() for t in tensors]
        graph = torch.cuda.CUDAGraph()
        try:
            with torch.cuda.graph(graph):
                outs = self.run(self.static_in)
        except Exception as e:  # an op that cannot be captured: run eagerly from now on
            self.failed = True
            self.graph, self.static_in, self.static_out = None, [], []
            warnings.warn(f"kernel call {self.name}: cannot be replayed as a CUDA graph "
                          f"({type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}); "
                          "running its ops one by one", stacklevel=3)
            return False
        self.graph, self.static_out = graph, list(outs)
        return True
