"""Run one call with ATen's intra-op parallelism off, on this thread only.

``torch.set_num_threads`` is not that: besides the calling thread's OpenMP setting it
stores a process-wide count that every thread adopts on its first parallel op, so
calls from several threads at once would leave threads with each other's counts.
OpenMP's own ``omp_set_num_threads`` sets the calling thread's count alone, and
ATen's parallel loops (``#pragma omp parallel``) read exactly that. So the OpenMP
runtime torch loaded is looked up in this process's memory map (Linux) and called
directly; where there is none (another threading backend, another OS), nothing is
changed and calls keep torch's threads.
"""

from __future__ import annotations

import ctypes
import functools

import torch

__all__ = ["on_this_thread_alone", "available"]

_RUNTIMES = ("libgomp", "libiomp5", "libomp")


@functools.cache
def _omp_set_num_threads():
    try:
        with open("/proc/self/maps") as f:
            paths = {line.split()[-1] for line in f if "/" in line}
    except OSError:
        return None
    for path in sorted(paths):
        name = path.rsplit("/", 1)[-1]
        if name.startswith(_RUNTIMES) and ".so" in name:
            try:
                fn = ctypes.CDLL(path).omp_set_num_threads
            except (OSError, AttributeError):
                continue
            fn.argtypes, fn.restype = [ctypes.c_int], None
            return fn
    return None


@functools.cache
def available() -> bool:
    """Whether calls can be put on their calling thread alone here."""
    return _omp_set_num_threads() is not None and "OpenMP" in torch.__config__.parallel_info()


def on_this_thread_alone(entry):
    """``entry`` run with this thread's OpenMP count at one, then set back; ``entry``
    itself where that cannot be done (``available``)."""
    if not available():
        return entry
    put, get = _omp_set_num_threads(), torch.get_num_threads

    def run(*args):
        n = get()  # also makes ATen apply its process-wide count to this thread first
        if n == 1:
            return entry(*args)
        put(1)
        try:
            return entry(*args)
        finally:
            put(n)
    return run
