"""Keep the C heap's freed memory for the next call instead of handing it back.

ATen allocates every intermediate of a kernel call or ATen region with
``posix_memalign`` and frees it when its last reader returns. glibc serves
blocks over its mmap threshold with a fresh ``mmap`` and unmaps them on free, and
gives freed memory at the top of its heap back to the kernel once more than its
trim threshold is free. Either way the next call faults every page in again,
thousands of minor page faults a call for a mid-sized model, which can cost a large
share of its run time; with freed memory kept, next to none. Scratch that
kernels allocate internally (oneDNN's, im2col buffers) is served the same way, so
this covers what an ``out=`` form cannot.

So an artifact records, at compile, how much freed memory its ATen work needs
kept (``retained_heap_bytes``: twice the intermediates of its largest kernel call,
every one counted as live at once, at least ``MIN_BYTES``), and loading it on
glibc sets the mmap threshold to its maximum and the trim threshold to at least
that size, for the whole process: the heap then holds up to that much freed
memory between calls and reuses it. Values are only ever raised, never lowered,
so two artifacts in one process keep the larger. Other code in the process is
served from the same heap (eager PyTorch beside an artifact runs faster, not
slower); the price is resident memory that stays at the high-water mark. Where
the C library is not glibc, or ``AOT_LEAVE_HEAP=1`` is set, nothing is changed.
"""

from __future__ import annotations

import ctypes
import functools
import os
import platform
import threading

from ..torch_tensor import TorchTensor

__all__ = ["retain", "retained_bytes", "planned_bytes", "MIN_BYTES", "MAX_BYTES", "CEILING"]

MIN_BYTES = 64 << 20  # glibc's own ceiling for its dynamic trim threshold
MAX_BYTES = 1 << 40  # a manifest asking for more is refused (aot.fallback.executor)
CEILING = (1 << 31) - 1  # the most mallopt takes (an int): for sizes known only at run time
MMAP_THRESHOLD_MAX = 32 << 20  # glibc's limit for M_MMAP_THRESHOLD on 64-bit
_M_TRIM_THRESHOLD, _M_MMAP_THRESHOLD = -1, -3  # <malloc.h>
_lock = threading.Lock()
_set = {"trim": 0}


@functools.cache
def _mallopt():
    if platform.libc_ver()[0] != "glibc":
        return None
    try:
        fn = ctypes.CDLL(None).mallopt
    except (OSError, AttributeError):
        return None
    fn.argtypes, fn.restype = [ctypes.c_int, ctypes.c_int], ctypes.c_int
    return fn


def available() -> bool:
    """Whether this process's C heap can be told to keep freed memory (glibc)."""
    return _mallopt() is not None


def retained_bytes() -> int:
    """The trim threshold this module set in this process (0: none set)."""
    return _set["trim"]


def retain(nbytes: int) -> bool:
    """Keep up to ``nbytes`` of freed memory in the heap (module docstring); True when
    the heap now keeps at least that much. Never lowers what an earlier call set."""
    if nbytes <= 0 or os.environ.get("AOT_LEAVE_HEAP", "") not in ("", "0"):
        return False
    fn = _mallopt()
    if fn is None:
        return False
    nbytes = min(max(nbytes, MIN_BYTES), CEILING)
    with _lock:
        if _set["trim"] >= nbytes:
            return True
        # the mmap threshold first: setting either turns off glibc's dynamic thresholds
        if not fn(_M_MMAP_THRESHOLD, MMAP_THRESHOLD_MAX) or not fn(_M_TRIM_THRESHOLD, nbytes):
            return False
        _set["trim"] = nbytes
    return True


def _bytes(t: TorchTensor) -> int | None:
    n = t.numel
    if n is None:
        return None
    return n * t.torch_dtype.itemsize


def planned_bytes(kernel_calls, driver: str, host_program: bool = False) -> int:
    """``retained_heap_bytes`` for an artifact: 0 off the CPU or without kernel calls;
    else twice the result bytes of the largest call (a group: every member's results),
    at least ``MIN_BYTES``; with a call whose sizes are known only at run time, or for
    a host program (the whole program in ATen, sizes known only at run time), the
    most ``retain`` can set (a ceiling: the heap keeps only what was freed)."""
    if not driver.startswith("local"):
        return 0
    if host_program:
        return CEILING
    if not kernel_calls:
        return 0
    largest = 0
    for spec in kernel_calls:
        total = 0
        for call in spec.members or (spec,):
            for r in call.results:
                b = _bytes(r)
                if b is None:
                    return CEILING
                total += b
        largest = max(largest, total)
    return min(max(2 * largest, MIN_BYTES), CEILING)
