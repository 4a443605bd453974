"""MKL's packed single-precision GEMM, reached with ctypes in torch's own library.

torch's x86-64 Linux builds link Intel MKL into ``libtorch_cpu.so`` and export its
CBLAS functions, among them the packed-matrix API (``cblas_sgemm_pack_get_size``,
``cblas_sgemm_pack``, ``cblas_sgemm_compute``). A weight is packed once into MKL's
own layout; a product then reads it with no copy of the weight per call and writes
into a buffer the caller gives (torch's ``mkl._mkl_linear`` allocates its result).
MKL runs on the OpenMP pool torch sets up, with torch's thread count.

``Packed(w, rows)`` holds ``w`` (``[n, k]``, a linear's weight) packed for products
of ``rows`` rows; ``Packed.product(x_ptr, out_ptr)`` computes ``out = x @ w.T`` for
a dense row-major ``x`` (``rows x k``) into a dense row-major ``out`` (``rows x n``).
"""

from __future__ import annotations

import ctypes as C
import functools
import os
import platform

import torch

__all__ = ["available", "Packed"]

_ROW_MAJOR, _NO_TRANS, _TRANS, _PACKED, _B_MATRIX = 101, 111, 112, 151, 162
_INT = C.c_int  # MKL's LP64 interface (the ``_64`` entry points are the ILP64 one)


@functools.cache
def _lib():
    if platform.system() != "Linux" or platform.machine().lower() not in ("x86_64", "amd64"):
        return None
    if not torch.backends.mkl.is_available():
        return None
    try:
        d = C.CDLL(os.path.join(os.path.dirname(torch.__file__), "lib", "libtorch_cpu.so"))
        size, pack, compute = (d.cblas_sgemm_pack_get_size, d.cblas_sgemm_pack,
                               d.cblas_sgemm_compute)
    except (OSError, AttributeError):
        return None
    size.restype = C.c_size_t
    size.argtypes = [_INT] * 4
    pack.restype = None
    pack.argtypes = [_INT] * 6 + [C.c_float, C.c_void_p, _INT, C.c_void_p]
    compute.restype = None
    compute.argtypes = [_INT] * 6 + [C.c_void_p, _INT, C.c_void_p, _INT, C.c_float,
                                     C.c_void_p, _INT]
    return size, pack, compute


def available() -> bool:
    """MKL's packed GEMM is exported by this torch build (x86-64 Linux)."""
    return _lib() is not None


class Packed:
    """A linear's weight ``[n, k]`` packed by MKL for products of ``rows`` rows."""

    def __init__(self, w: torch.Tensor, rows: int):
        lib = _lib()
        if lib is None:
            raise RuntimeError("MKL's packed GEMM is not available in this torch build")
        size, pack, self._compute = lib
        if w.dtype != torch.float32 or w.dim() != 2:
            raise ValueError(f"a float32 [n, k] weight, not {w.dtype} {tuple(w.shape)}")
        w = w.detach().contiguous()
        self.rows, (self.n, self.k) = int(rows), w.shape
        nbytes = size(_B_MATRIX, self.rows, self.n, self.k)
        self.buf = torch.empty(nbytes // 4 + 16)
        pack(_ROW_MAJOR, _B_MATRIX, _TRANS, self.rows, self.n, self.k, 1.0, w.data_ptr(),
             self.k, self.buf.data_ptr())
        self.ptr = self.buf.data_ptr()

    def product(self, x_ptr: int, out_ptr: int) -> None:
        """``out = x @ w.T`` (``x``: ``rows x k``, ``out``: ``rows x n``, both dense)."""
        self._compute(_ROW_MAJOR, _NO_TRANS, _PACKED, self.rows, self.n, self.k, x_ptr,
                      self.k, self.ptr, self.n, 0.0, out_ptr, self.n)
