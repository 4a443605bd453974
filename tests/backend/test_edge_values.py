"""An edge-value corpus (issue 35): ops of every class the compiler lowers, fed values at
the edges of their dtypes (int64/int32 extremes, large-mean and large-range floats,
denormals, inf and NaN, mixed dtypes), compiled where IREE lowers them
(``placement="coverage"``) and compared with eager: bit for bit where ATen is exact
(integers, bools, comparisons, selections, casts), within float32 rounding elsewhere,
NaN and inf patterns equal. A mismatch is closed by a correct compiled form or a rule
that sends the op to ATen (``aot.partition.iree_faults``), never left as a wrong answer.

Denormals: IREE's CPU code flushes them to zero (inputs and results, on its worker
threads and the calling thread alike), which no compile flag of IREE 3.13 turns off.
Compiled results are compared with eager run with ``torch.set_flush_denormal(True)``
(one thread: the flag is per thread), and an all-ATen artifact (``fallback="all"``) is
eager's bit for bit without it (docs/coverage.md).
"""

import contextlib

import pytest
import torch

import aot
from one_function import Fn

I64 = torch.iinfo(torch.int64)
I32 = torch.iinfo(torch.int32)
F32 = torch.finfo(torch.float32)


def _ints(dtype):
    info = torch.iinfo(dtype)
    return torch.tensor([info.max, info.min, info.max - 1, info.min + 1, 0, 1, -1, 2, -3,
                         1 << 30, -(1 << 30), 7, -7, 1 << 24 | 1, -(1 << 24 | 1), 1 << 20],
                        dtype=dtype)


def _floats():
    return torch.tensor([0.0, -0.0, 1.0, -1.0, F32.max, -F32.max, F32.tiny, -F32.tiny,
                         1e-40, -1e-40, float("inf"), float("-inf"), float("nan"), 1e30,
                         -1e30, 16777217.0, 0.5, 2.5, -2.5, 3.0], dtype=torch.float32)


@contextlib.contextmanager
def _flushing():
    """Eager with denormals flushed to zero, as IREE's CPU code runs."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    assert torch.set_flush_denormal(True)
    try:
        yield
    finally:
        torch.set_flush_denormal(False)
        torch.set_num_threads(threads)


def _flush(a):
    if not a.dtype.is_floating_point:
        return a
    return torch.where(a.abs() < torch.finfo(a.dtype).tiny, a * 0, a)


def _same(g, w, exact, rtol, atol):
    """Elementwise: equal (NaN where NaN), or close for inexact float ops."""
    if w.dtype.is_floating_point:
        gg, ww = g.double(), w.double()
        ok = (gg == ww) | (gg.isnan() & ww.isnan())
        if not exact:
            ok |= torch.isclose(gg, ww, rtol=rtol, atol=atol)
        return ok
    return g == w


def _check(fn, *args, exact=True, rtol=1.3e-6, atol=1e-30, **options):
    """Compile ``fn`` (``placement="coverage"`` unless ``options`` say otherwise) and
    compare with eager: each element equal to eager's, or, compiled, to eager's with
    denormals flushed (inputs read as zero, results flushed: IREE's CPU code may do
    either, per op)."""
    m = Fn(fn).eval()
    cm = aot.compile(m, args, **(options or {"placement": "coverage"}))
    got = cm(*args)
    want = m(*args)
    flushed = None
    if options.get("fallback") != "all":
        with _flushing():
            flushed = m(*[_flush(a) for a in args])
    gots = got if isinstance(got, tuple) else (got,)
    wants = want if isinstance(want, tuple) else (want,)
    flusheds = (flushed if isinstance(flushed, tuple) else (flushed,)) if flushed is not None \
        else (None,) * len(wants)
    for k, (g, w, f) in enumerate(zip(gots, wants, flusheds)):
        assert g.dtype == w.dtype and g.shape == w.shape, (k, g.dtype, w.dtype)
        ok = _same(g, w, exact, rtol, atol)
        if f is not None:
            ok |= _same(g, f, exact, rtol, atol)
        assert ok.all(), f"output {k}: got {g[~ok].tolist()} where eager has {w[~ok].tolist()}"
    return cm


INT_OPS = {
    "add": lambda a, b: a + b,  # wraps at the extremes, as eager does
    "sub": lambda a, b: a - b,
    "mul": lambda a, b: a * b,
    "neg_abs": lambda a, b: (-a, a.abs()),
    "floor_div": lambda a, b: torch.div(a, b.masked_fill(b == 0, 3), rounding_mode="floor"),
    "trunc_div": lambda a, b: torch.div(a, b.masked_fill(b == 0, 3), rounding_mode="trunc"),
    "remainder": lambda a, b: torch.remainder(a, b.masked_fill(b == 0, 5)),
    "fmod": lambda a, b: torch.fmod(a, b.masked_fill(b == 0, 5)),
    "div_scalar": lambda a, b: (torch.div(a, 1073741824, rounding_mode="floor"),
                                torch.div(a, -7, rounding_mode="trunc"), a // 3),
    "bitwise": lambda a, b: (a & b, a | b, a ^ b, ~a),
    "shift": lambda a, b: (a << 3, a >> 5),
    "compare": lambda a, b: (a < b, a <= b, a == b, a > b, torch.maximum(a, b),
                             torch.minimum(a, b)),
    "reduce": lambda a, b: (a.sum(), a.amax(), a.amin(), a.argmax(), a.argmin(),
                            torch.cumsum(a, 0), a.prod()),
    "to_float": lambda a, b: (a.float(), a.double(), a.to(torch.int8), a.to(torch.bool)),
    "clamp": lambda a, b: (a.clamp(-100, 1 << 20), a.clamp(min=b.min())),
    "sign_where": lambda a, b: (torch.sign(a), torch.where(a > b, a, b)),
}


@pytest.mark.parametrize("dtype", [torch.int64, torch.int32])
@pytest.mark.parametrize("op", sorted(INT_OPS))
def test_integer_ops_at_the_extremes_are_exact(op, dtype):
    a = _ints(dtype)
    b = a.flip(0)
    _check(INT_OPS[op], a, b)


FLOAT_OPS = {
    "arith": (lambda a, b: (a + b, a - b, a * b, a / b), True),
    "compare": (lambda a, b: (a < b, a == b, a != b, a >= b, torch.isnan(a), torch.isinf(a),
                              torch.isfinite(a)), True),
    "max_min": (lambda a, b: (torch.maximum(a, b), torch.minimum(a, b), torch.fmax(a, b),
                              a.clamp(-1, 1)), True),
    "select": (lambda a, b: (torch.where(a > b, a, b), a.masked_fill(a != a, 0.0),
                             torch.nan_to_num(a)), True),
    "round": (lambda a, b: (a.floor(), a.ceil(), a.round(), a.trunc(), a.frac()), True),
    "to_half": (lambda a, b: (a.half(), a.bfloat16(), a.double()), True),
    "to_int": (lambda a, b: a.clamp(-1e9, 1e9).nan_to_num(0.0).to(torch.int64), True),
    "abs_neg": (lambda a, b: (a.abs(), -a, torch.copysign(a, b), torch.signbit(a)), True),
    "reduce": (lambda a, b: (a.amax(), a.amin(), a.argmax(), a.nansum(), a.sum()), True),
    "exp_log": (lambda a, b: (a.exp(), a.abs().log(), a.sigmoid(), a.tanh(),
                              a.abs().sqrt()), False),
    "softmax": (lambda a, b: (torch.softmax(a.nan_to_num(0.0, 1e30, -1e30), 0),
                              torch.log_softmax(a.nan_to_num(0.0, 1e30, -1e30), 0)), False),
}


@pytest.mark.parametrize("op", sorted(FLOAT_OPS))
def test_float_ops_at_the_edges(op):
    a = _floats()
    fn, exact = FLOAT_OPS[op]
    _check(fn, a, a.flip(0), exact=exact)


def test_large_mean_and_large_range_normalisations():
    """Variances and layer norms of values near 1e4 with a spread of 1 (and of a range
    of 1e6): compiled, they are within ATen's own float32 error of the float64 result
    (here closer: IREE's one-pass variance, which cancelled to garbage, is replaced by
    two passes over shifted values, ``var_rewrites``)."""
    torch.manual_seed(0)
    x = torch.rand(4, 3, 64, 256) + 1e4  # large mean, small spread
    y = torch.randn(4, 3, 64, 256) * 1e6  # large range
    w, b = torch.randn(256), torch.randn(256)

    def fn(x, y):
        return (x.var([2, 3]), x.std(-1, correction=2), y.var([1, 2]),
                torch.nn.functional.layer_norm(x, x.shape[-1:], w.to(x.dtype), b.to(x.dtype)),
                torch.nn.functional.layer_norm(x, x.shape[-2:]))
    m = Fn(fn).eval()
    cm = aot.compile(m, (x, y), placement="coverage")
    for k, (got, want, exact) in enumerate(zip(cm(x, y), m(x, y), m(x.double(), y.double()))):
        ours = ((got.double() - exact).abs() / exact.abs().clamp_min(1.0)).max().item()
        aten = ((want.double() - exact).abs() / exact.abs().clamp_min(1.0)).max().item()
        assert ours <= max(aten, 2e-6), (k, ours, aten)


def test_mixed_dtype_operands_promote_as_eager():
    i64, i32 = _ints(torch.int64), _ints(torch.int32)
    f, u8 = _floats(), torch.arange(16, dtype=torch.uint8) * 17
    b = i64 > 0
    _check(lambda i64, i32, f, u8, b: (i64 + i32, i32 * u8, u8 + b, b * f[:16],
                                       i32 + f[:16], torch.where(b, i32, u8)),
           i64, i32, f, u8, b)


@pytest.mark.parametrize("op", ["arith", "round", "to_half", "max_min"])
def test_an_all_aten_artifact_keeps_denormals_as_eager(op):
    """Where denormals matter, fallback="all" is eager bit for bit (no flushing)."""
    a = _floats()
    fn, _ = FLOAT_OPS[op]
    _check(fn, a, a.flip(0), fallback="all")
