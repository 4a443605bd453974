"""RMS normalization as one kernel: ``x * rsqrt(mean(x^2, -1) + eps)`` (times a weight).

T5's and Llama's norms arrive as five or six ATen ops (``pow``, ``mean``, ``add``,
``rsqrt``, ``mul``, ``mul`` by the weight), which ran as three oneDNN primitives (an
elementwise square, a reduction with its post-ops, the two products as one binary):
three passes over the rows and three primitive calls, 0.055 ms for T5-small's
128 x 512 on a 2-core Xeon, fourteen of them a call. Here each row is read once for
its sum of squares and once more as it is scaled, in one call.

The products are made in the eager order (``x * r``, then by the weight); the sum of
squares is float32 in another order than ATen's: results differ by rounding (1e-7 of
the largest). As in torch, a NaN in a row makes the row NaN, and an inf makes it 0
but for the inf's place (inf * 0: NaN).

The C source (``_SOURCE``) is compiled once per process by ``c_compiler`` for this CPU
(OpenMP over rows where there are enough); ``available()`` is false where no compiler
works.
"""

from __future__ import annotations

import ctypes as C
import functools

import torch

from . import c_compiler, c_vectors

__all__ = ["available", "Norm"]

_SOURCE = c_vectors.PRELUDE + r"""

struct aot_rms_args {
    const float *x, *w;
    float *y;
    long rows, n;
    float eps;
};

/* y[i, j] = (x[i, j] * r_i) * w[j] (w may be NULL), r_i = 1 / sqrt(mean_j x[i, j]^2 + eps);
   rows dense. Returns 0. */
int aot_rms_norm_run(const struct aot_rms_args *a) {
    const long rows = a->rows, n = a->n;
    const float *w = a->w;
#pragma omp parallel for schedule(static) if (rows * n >= 16384)
    for (long i = 0; i < rows; ++i) {
        const float *xr = a->x + i * n;
        float *yr = a->y + i * n;
        vf acc = {};
        long j = 0;
        for (; j + VL <= n; j += VL) {
            vf v = ld(xr + j);
            acc += v * v;
        }
        float s = 0.f;
        for (int k = 0; k < VL; ++k) s += acc[k];
        for (; j < n; ++j) s += xr[j] * xr[j];
        const float r = 1.f / sqrtf(s / (float)n + a->eps);
        const vf rv = bc(r);
        j = 0;
        if (w) {
            for (; j + VL <= n; j += VL) st(yr + j, (ld(xr + j) * rv) * ld(w + j));
            for (; j < n; ++j) yr[j] = (xr[j] * r) * w[j];
        } else {
            for (; j + VL <= n; j += VL) st(yr + j, ld(xr + j) * rv);
            for (; j < n; ++j) yr[j] = xr[j] * r;
        }
    }
    return 0;
}
"""

_FLAGS = c_vectors.FLAGS + ("-fno-math-errno",)


class _Args(C.Structure):
    _fields_ = [("x", C.c_void_p), ("w", C.c_void_p), ("y", C.c_void_p), ("rows", C.c_long),
                ("n", C.c_long), ("eps", C.c_float)]


def _lib():
    return _build(_FLAGS)


@functools.cache
def _build(flags: tuple):
    return c_compiler.load_kernel(_SOURCE, flags, "the RMS norm kernel", "aot_rms_norm_run")


def available() -> bool:
    """The kernel compiled in this process."""
    return _lib() is not None


class Norm:
    """The RMS norm of ``rows`` dense rows of ``n`` floats, with ``eps`` and an optional
    weight of ``n``. ``kernel`` and ``args`` are the C call ``__call__`` makes, for a
    caller's own loop, once ``x`` and ``y`` are set there (``point``)."""

    def __init__(self, rows: int, n: int, eps: float, weight: torch.Tensor | None = None):
        self._lib = _lib()
        if self._lib is None:
            raise ValueError("the RMS norm kernel is not available in this process")
        if rows < 1 or n < 1:
            raise ValueError(f"an RMS norm of {rows} rows of {n} has nothing to do")
        if weight is not None and tuple(weight.shape) != (n,):
            raise ValueError(f"a weight of shape {tuple(weight.shape)} for rows of {n}")
        self.w = None if weight is None else weight.detach().float().contiguous()
        self.a = _Args(w=None if self.w is None else self.w.data_ptr(), rows=rows, n=n,
                       eps=eps)
        self.args = C.addressof(self.a)
        self.kernel = C.cast(self._lib.aot_rms_norm_run, C.c_void_p).value

    def point(self, x: int, y: int) -> None:
        self.a.x, self.a.y = x, y

    def run(self) -> None:
        self._lib.aot_rms_norm_run(self.args)

    def __call__(self, x: int, y: int) -> None:
        self.point(x, y)
        self.run()
