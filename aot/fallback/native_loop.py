"""A run of oneDNN primitives (and kernels of our own) executed by one C loop instead of
one ctypes call each.

A primitive step called from Python costs 1.5-2 us of host time over the primitive
itself (the loop, the closure, ctypes' argument conversion): 0.17 ms of
EfficientNet-B0's 115 primitives, 0.9 ms of MobileBERT's 457. ``Run(lib, prims)``
executes primitives whose memory objects point at fixed buffers (no handle is set
per call) with one call into a loop of a few lines of C; a kernel of this package's own
C (``Kernel``: a function taking the address of its arguments, e.g. ``depthwise.Conv``)
takes its place in the same loop.

The loop is compiled once per process (``c_compiler``). Where no compiler works,
``available()`` is false and the program calls its primitives one by one, as it
would without this module.
"""

from __future__ import annotations

import ctypes as C
import functools

from . import c_compiler
from . import dnnl_api as D

__all__ = ["available", "Kernel", "Run"]

_SOURCE = r"""
typedef int (*execute_t)(void *primitive, void *stream, int nargs, const void *args);
typedef int (*kernel_t)(const void *args);

/* Executes step 0..n) in order: kernels[i](args[i]) where kernels[i] is set, else
   primitives[i] with its arguments; at the first failure its index is returned and
   its status stored; -1 when all succeeded. */
int aot_run_primitives(execute_t execute, void *stream, int n, void *const *primitives,
                       const int *nargs, const void *const *args, const kernel_t *kernels,
                       int *status) {
    for (int i = 0; i < n; ++i) {
        int s = kernels[i] ? kernels[i](args[i])
                           : execute(primitives[i], stream, nargs[i], args[i]);
        if (s != 0) {
            *status = s;
            return i;
        }
    }
    return -1;
}
"""


@functools.cache
def _loop():
    """The compiled loop (a ctypes function), or None where it cannot be built."""
    lib = c_compiler.load(_SOURCE, ["-O2"], "the primitive loop")
    fn = getattr(lib, "aot_run_primitives", None)
    if fn is None:
        return None
    fn.restype = C.c_int
    fn.argtypes = [C.c_void_p, C.c_void_p, C.c_int, C.c_void_p, C.c_void_p, C.c_void_p,
                   C.c_void_p, C.c_void_p]
    return fn


def available() -> bool:
    """The loop compiled in this process."""
    return _loop() is not None


class Kernel:
    """A step of ours for a ``Run``: ``kernel`` (the address of a C function returning 0
    on success) called with ``args`` (an address); ``keep`` is what those addresses
    point into, kept alive by the run."""

    def __init__(self, kernel: int, args: int, what: str, keep):
        self.kernel, self.args, self.what, self.keep = kernel, args, what, keep


class Run:
    """``prims`` (``dnnl_api.Primitive``, their memory at fixed addresses, or ``Kernel``)
    executed in order by one call: ``run(env)`` (the program's slots, unused) is a
    program step."""

    def __init__(self, lib: D.Lib, prims: list):
        loop = _loop()
        if loop is None:
            raise ValueError("the primitive loop is not available in this process")
        n = len(prims)
        self.prims = prims  # keeps the primitives and their memory objects alive
        ours = [isinstance(p, Kernel) for p in prims]
        self._handles = (C.c_void_p * n)(*[None if k else p.h.value
                                           for p, k in zip(prims, ours)])
        self._nargs = (C.c_int * n)(*[0 if k else p.n for p, k in zip(prims, ours)])
        self._args = (C.c_void_p * n)(*[p.args if k else C.addressof(p.args)
                                        for p, k in zip(prims, ours)])
        self._kernels = (C.c_void_p * n)(*[p.kernel if k else None
                                           for p, k in zip(prims, ours)])
        self._status = C.c_int(0)
        execute = C.cast(lib.execute, C.c_void_p)
        call = (loop, execute, lib.stream, n, self._handles, self._nargs, self._args,
                self._kernels, C.byref(self._status))
        self._call = functools.partial(*call)

    def __call__(self, env) -> None:
        failed = self._call()
        if failed >= 0:
            raise D.DnnlError(f"failed running {self.prims[failed].what} "
                              f"(status {self._status.value})")
