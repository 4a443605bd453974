"""One thread budget for a program that mixes compiled code and kernel calls.

On the CPU, IREE's compiled dispatches run on its task workers (one per core the
device was opened with) while the calling thread waits; a kernel call runs ATen on
the calling thread, which wakes torch's OpenMP team for any op over ATen's grain
size. After the op, the team's threads spin for a while before they sleep, on the
cores IREE's workers need for the next dispatch: two pools then compete for the
same cores. For light ops (a few tens of microseconds) between compiled dispatches
that contention costs far more than the team's parallelism saves: on few cores such
a program can run about twice as fast with those calls on the calling thread alone
(``benchmarks/thread_budget.py``).

So a light kernel call in such a program runs on the calling thread alone
(``ExecOptions.one_thread_calls``): every op it runs is an ATen or prims op whose
FLOPs (where torch has a formula) are under ``MIN_FLOPS`` and whose results hold at
most ``MAX_ELEMENTS`` elements (known at compile), and no op is of a family without
a FLOP formula that can be heavy (``HEAVY_PREFIXES``). Heavy calls (convolutions,
matmuls, custom and quantized kernels) keep torch's threads, where the team's
parallelism can be worth its spin; whether it is, is measured: the region measurement
times the same artifact with every call on one thread beside it (``regions``,
``iree-one-thread``). Programs with no compiled code (one ATen region) or
on IREE's ``local-sync`` driver keep torch's threads for every call.
"""

from __future__ import annotations

from ..fallback.spec import KernelCallSpec
from .cost import MIN_FLOPS
from .placement import Placement
from ..toolchain.targets import Target

__all__ = ["one_thread_calls", "MAX_ELEMENTS"]

MAX_ELEMENTS = 1 << 22  # 4M elements (16 MB of float32): beyond, two threads save ~ms
LIGHT_NAMESPACES = ("aten::", "prims::")
# ops without a FLOP formula that can still be heavy: they keep torch's threads
HEAVY_PREFIXES = ("aten::lstm", "aten::gru", "aten::rnn_", "aten::_fft", "aten::fft_",
                  "aten::linalg_", "aten::_linalg", "aten::cholesky", "aten::svd",
                  "aten::qr", "aten::triangular_solve", "aten::sort", "aten::topk",
                  "aten::embedding_bag", "aten::_embedding_bag", "aten::cdist",
                  "aten::_cdist", "aten::histc", "aten::unique", "aten::_unique",
                  "aten::conv", "aten::_conv", "aten::mkldnn", "aten::_mkldnn")


def _light(spec: KernelCallSpec, flops: dict[str, int]) -> bool:
    calls = spec.members or (spec,)
    for c in calls:
        if not c.op.startswith(LIGHT_NAMESPACES) or c.op.startswith(HEAVY_PREFIXES):
            return False
        for r in c.results:
            n = r.numel
            if n is None or n > MAX_ELEMENTS:
                return False
    return flops.get(spec.key, 0) < MIN_FLOPS


def one_thread_calls(placements: list[Placement], kernel_calls: list[KernelCallSpec],
                     target: Target) -> tuple[str, ...]:
    """Keys of the light kernel calls of a program with compiled code on IREE's task
    workers (module docstring), or ``()``."""
    if target.driver != "local-task" or not any(pl.where == "compiled" for pl in placements):
        return ()
    flops: dict[str, int] = {}
    for pl in placements:
        if pl.key is not None:
            flops[pl.key] = max(flops.get(pl.key, 0), pl.flops or 0)
    return tuple(k.key for k in kernel_calls if _light(k, flops))
