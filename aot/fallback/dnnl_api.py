"""oneDNN's C API, reached with ctypes: primitives created once, executed with one call each.

The ``onednn-cpu-gomp`` wheel installs oneDNN 3.x (built with GNU OpenMP, the thread
pool torch already runs) as ``<prefix>/lib/libdnnl.so.3``; torch's own copy of oneDNN
is linked in privately and cannot be called. Each primitive here (a convolution with
its bias and fused post-ops, a matrix product, an elementwise op, a reduction, ...)
is created once for fixed shapes and layouts, and one call to it afterwards costs the
host a few microseconds (``dnnl_primitive_execute``), against tens through ATen.

The enum values below are oneDNN 3.x's (stable across its 3.x ABI); ``available``
checks a few of them against the library's own names for them before anything is
used. Every call that fails raises ``DnnlError`` with oneDNN's status.
"""

from __future__ import annotations

import ctypes as C
import functools
import os
import platform
import sys
import threading

import torch

__all__ = ["available", "DnnlError", "Lib", "lib", "Memory", "Primitive", "post_ops",
           "ELTWISE", "BINARY", "ARG_SRC", "ARG_SRC_1", "ARG_DST", "ARG_WEIGHTS", "ARG_BIAS",
           "ARG_SCRATCHPAD", "ARG_SCALE", "ARG_SHIFT", "ARG_ATTR_SCALES", "post_op_src1",
           "scaled_source"]

F32 = 3
FORMAT_ANY = 1
ENGINE_CPU = 1
FORWARD_INFERENCE = 96
CONVOLUTION_DIRECT = 0x1
ELTWISE = {name: 0x20 + i for i, name in enumerate((
    "relu", "tanh", "elu", "square", "abs", "sqrt", "linear", "soft_relu", "hardsigmoid",
    "logistic", "exp", "gelu_tanh", "swish", "log", "clip", "clip_v2", "pow", "gelu_erf",
    "round", "mish", "hardswish"))}
BINARY = {"add": 0x1fff0, "mul": 0x1fff1, "max": 0x1fff2, "min": 0x1fff3, "div": 0x1fff4,
          "sub": 0x1fff5}
POOLING = {"max": 0x1ff, "avg_include_padding": 0x2ff, "avg_exclude_padding": 0x3ff}
REDUCTION_MEAN = 0x2fff1 + 5  # reduction_max follows resampling_linear; mean is 5th
SOFTMAX_ACCURATE = 0x30000
USE_SCALE, USE_SHIFT = 0x2, 0x4  # normalization flags
QUERY_IMPL_INFO_STR = 8
QUERY_WEIGHTS_MD = 131
QUERY_DST_MD = 133
QUERY_SCRATCHPAD_MD = 136
SCRATCHPAD_MODE_USER = 1
ARG_SRC, ARG_SRC_1, ARG_DST, ARG_WEIGHTS, ARG_BIAS = 1, 2, 17, 33, 41
ARG_SCALE, ARG_SHIFT = 51, 52
ARG_SCRATCHPAD = 80
ARG_ATTR_SCALES = 4096  # | the argument the scales apply to
_POST_OP_BASE = 32768


def post_op_src1(index: int) -> int:
    """The execute argument of the ``index``-th post-op's second operand."""
    return _POST_OP_BASE * (index + 1) | ARG_SRC_1


class DnnlError(RuntimeError):
    """A oneDNN call that did not return success."""


_DIMS = C.c_int64 * 12
_V = C.c_void_p


class _Arg(C.Structure):
    _fields_ = [("arg", C.c_int), ("memory", _V)]


def _dims(xs) -> _DIMS:
    d = _DIMS()
    for i, x in enumerate(xs):
        d[i] = int(x)
    return d


def _library_path() -> str | None:
    """Where the wheel put the library: the environment's ``lib/`` (a ``--user``
    install: the user base's)."""
    import site

    for prefix in (sys.prefix, sys.base_prefix, site.getuserbase()):
        p = os.path.join(prefix, "lib", "libdnnl.so.3")
        if os.path.exists(p):
            return p
    return None


class Lib:
    """The loaded library, its CPU engine and one in-order stream."""

    def __init__(self, path: str):
        d = C.CDLL(path)
        self.d = d
        d.dnnl_primitive_desc_query_md.restype = _V
        d.dnnl_memory_desc_get_size.restype = C.c_size_t
        for f in ("dnnl_alg_kind2str", "dnnl_dt2str"):
            getattr(d, f).restype = C.c_char_p
        d.dnnl_post_ops_append_eltwise.argtypes = [_V, C.c_int, C.c_float, C.c_float]
        d.dnnl_post_ops_append_binary.argtypes = [_V, C.c_int, _V]
        d.dnnl_primitive_execute.argtypes = [_V, _V, C.c_int, _V]
        d.dnnl_memory_set_data_handle.argtypes = [_V, _V]
        self.engine, self.stream = _V(), _V()
        self.check(d.dnnl_engine_create(C.byref(self.engine), ENGINE_CPU, C.c_size_t(0)),
                   "creating the CPU engine")
        self.check(d.dnnl_stream_create(C.byref(self.stream), self.engine, C.c_uint(1)),
                   "creating a stream")
        self.execute = d.dnnl_primitive_execute
        self.set_handle = d.dnnl_memory_set_data_handle

    @staticmethod
    def check(status: int, doing: str) -> None:
        if status != 0:
            raise DnnlError(f"oneDNN failed {doing} (status {status})")

    def names_agree(self) -> bool:
        """The enum values above name what the library calls them."""
        alg = self.d.dnnl_alg_kind2str
        return (alg(ELTWISE["relu"]) == b"eltwise_relu"
                and alg(ELTWISE["hardswish"]) == b"eltwise_hardswish"
                and alg(ELTWISE["gelu_erf"]) == b"eltwise_gelu_erf"
                and alg(BINARY["sub"]) == b"binary_sub"
                and alg(POOLING["avg_exclude_padding"]) == b"pooling_avg_exclude_padding"
                and alg(REDUCTION_MEAN) == b"reduction_mean"
                and alg(SOFTMAX_ACCURATE) == b"softmax_accurate"
                and self.d.dnnl_dt2str(F32) == b"f32")

    # memory descriptors ----------------------------------------------------------
    def md(self, shape, strides) -> "_Md":
        md = _V()
        self.check(self.d.dnnl_memory_desc_create_with_strides(
            C.byref(md), len(shape), _dims(shape), F32, _dims(strides)),
            f"describing a {tuple(shape)} tensor")
        return _Md(self, md)

    def md_any(self, shape) -> "_Md":
        md = _V()
        self.check(self.d.dnnl_memory_desc_create_with_tag(
            C.byref(md), len(shape), _dims(shape), F32, FORMAT_ANY),
            f"describing a {tuple(shape)} tensor")
        return _Md(self, md)

    def md_of(self, t: torch.Tensor) -> "_Md":
        return self.md(t.shape, t.stride())

    # primitive descriptors --------------------------------------------------------
    def convolution(self, src, weights, bias, dst, strides, dilates, pad_l, pad_r, attr):
        pd = _V()
        self.check(self.d.dnnl_convolution_forward_primitive_desc_create(
            C.byref(pd), self.engine, FORWARD_INFERENCE, CONVOLUTION_DIRECT, src.h, weights.h,
            None if bias is None else bias.h, dst.h, _dims(strides), _dims(dilates),
            _dims(pad_l), _dims(pad_r), attr), "creating a convolution")
        return pd

    def matmul(self, src, weights, bias, dst, attr):
        pd = _V()
        self.check(self.d.dnnl_matmul_primitive_desc_create(
            C.byref(pd), self.engine, src.h, weights.h, None if bias is None else bias.h,
            dst.h, attr), "creating a matrix product")
        return pd

    def eltwise(self, alg, alpha, beta, src, dst, attr):
        pd = _V()
        self.check(self.d.dnnl_eltwise_forward_primitive_desc_create(
            C.byref(pd), self.engine, FORWARD_INFERENCE, alg, src.h, dst.h, C.c_float(alpha),
            C.c_float(beta), attr), "creating an elementwise op")
        return pd

    def binary(self, alg, src0, src1, dst, attr):
        pd = _V()
        self.check(self.d.dnnl_binary_primitive_desc_create(
            C.byref(pd), self.engine, alg, src0.h, src1.h, dst.h, attr), "creating a binary op")
        return pd

    def pooling(self, alg, src, dst, strides, kernel, dilation, pad_l, pad_r, attr):
        pd = _V()
        self.check(self.d.dnnl_pooling_forward_primitive_desc_create(
            C.byref(pd), self.engine, FORWARD_INFERENCE, alg, src.h, dst.h, _dims(strides),
            _dims(kernel), _dims(dilation), _dims(pad_l), _dims(pad_r), attr),
            "creating a pooling")
        return pd

    def reduction(self, alg, src, dst, attr):
        pd = _V()
        self.check(self.d.dnnl_reduction_primitive_desc_create(
            C.byref(pd), self.engine, alg, src.h, dst.h, C.c_float(0.0), C.c_float(0.0),
            attr), "creating a reduction")
        return pd

    def softmax(self, src, dst, axis: int, attr):
        pd = _V()
        self.check(self.d.dnnl_softmax_forward_primitive_desc_create(
            C.byref(pd), self.engine, FORWARD_INFERENCE, SOFTMAX_ACCURATE, src.h, dst.h,
            C.c_int(axis), attr), "creating a softmax")
        return pd

    def layer_norm(self, src, dst, eps: float, flags: int, attr):
        """Normalization over the last dimension (statistics computed, not kept)."""
        pd = _V()
        self.check(self.d.dnnl_layer_normalization_forward_primitive_desc_create(
            C.byref(pd), self.engine, FORWARD_INFERENCE, src.h, dst.h, None, C.c_float(eps),
            C.c_uint(flags), attr), "creating a layer normalization")
        return pd

    def reorder(self, src, dst, attr=None):
        pd = _V()
        self.check(self.d.dnnl_reorder_primitive_desc_create(
            C.byref(pd), src.h, self.engine, dst.h, self.engine, attr), "creating a reorder")
        return pd

    def weights_md(self, pd) -> "_Md":
        """The weights layout a primitive chose (owned by the primitive descriptor)."""
        return _Md(self, _V(self.d.dnnl_primitive_desc_query_md(pd, QUERY_WEIGHTS_MD, 0)),
                   owned=False)

    def dst_md(self, pd) -> "_Md":
        """The result layout a primitive chose (owned by the primitive descriptor)."""
        return _Md(self, _V(self.d.dnnl_primitive_desc_query_md(pd, QUERY_DST_MD, 0)),
                   owned=False)

    def clone(self, pd):
        """A copy of the primitive descriptor ``pd`` (the caller destroys it)."""
        out = _V()
        self.check(self.d.dnnl_primitive_desc_clone(C.byref(out), pd), "copying a descriptor")
        return out

    def implementation(self, pd) -> str:
        """The name of the kernel a primitive descriptor chose (``ref:any`` for oneDNN's
        reference code, ``brg:avx512_core``, ...)."""
        name = C.c_char_p()
        self.check(self.d.dnnl_primitive_desc_query(pd, QUERY_IMPL_INFO_STR, 0,
                                                    C.byref(name)), "asking for a kernel")
        return (name.value or b"").decode("ascii", "replace")

    def scratchpad_md(self, pd) -> "_Md | None":
        """The scratch memory a primitive needs (owned by the descriptor), or None."""
        h = self.d.dnnl_primitive_desc_query_md(pd, QUERY_SCRATCHPAD_MD, 0)
        return _Md(self, _V(h), owned=False) if h else None


class _Md:
    def __init__(self, lib: Lib, h, owned: bool = True):
        self.lib, self.h, self.owned = lib, h, owned

    @property
    def nbytes(self) -> int:
        return int(self.lib.d.dnnl_memory_desc_get_size(self.h))

    def __del__(self):
        if self.owned and self.h:
            try:
                self.lib.d.dnnl_memory_desc_destroy(self.h)
            except Exception:  # noqa: BLE001  (interpreter shutdown)
                pass


class Memory:
    """A oneDNN memory object over a buffer the caller keeps alive."""

    def __init__(self, lib: Lib, md: _Md, ptr: int):
        self.lib, self.h = lib, _V()
        lib.check(lib.d.dnnl_memory_create(C.byref(self.h), md.h, lib.engine, _V(ptr or None)),
                  "creating a memory object")

    def __del__(self):
        try:
            self.lib.d.dnnl_memory_destroy(self.h)
        except Exception:  # noqa: BLE001
            pass


def post_ops(lib: Lib, ops) -> _V:
    """A primitive attribute holding ``ops``: ``("eltwise", alg, alpha, beta)`` or
    ``("binary", alg, md)``, applied in order to the primitive's result."""
    attr = _V()
    lib.check(lib.d.dnnl_primitive_attr_create(C.byref(attr)), "creating an attribute")
    # scratch memory is the caller's (``ARG_SCRATCHPAD``): oneDNN's own is kept per
    # thread and sized when a primitive is created, so a primitive run from another
    # thread would find none
    lib.check(lib.d.dnnl_primitive_attr_set_scratchpad_mode(attr, SCRATCHPAD_MODE_USER),
              "asking for a user scratchpad")
    if ops:
        po = _V()
        lib.check(lib.d.dnnl_post_ops_create(C.byref(po)), "creating post-ops")
        for op in ops:
            if op[0] == "eltwise":
                lib.check(lib.d.dnnl_post_ops_append_eltwise(po, op[1], op[2], op[3]),
                          "adding an elementwise post-op")
            else:
                lib.check(lib.d.dnnl_post_ops_append_binary(po, op[1], op[2].h),
                          "adding a binary post-op")
        lib.check(lib.d.dnnl_primitive_attr_set_post_ops(attr, po), "setting post-ops")
        lib.d.dnnl_post_ops_destroy(po)
    return attr


def scaled_source(lib: Lib, mask: int) -> _V:
    """An attribute for a reorder that multiplies its source by scales given per call
    (``ARG_ATTR_SCALES | ARG_SRC``), one per index of the dimensions in ``mask``."""
    attr = post_ops(lib, [])
    try:
        lib.check(lib.d.dnnl_primitive_attr_set_scales_mask(attr, ARG_SRC, mask),
                  "asking for scales")
    except DnnlError:
        lib.d.dnnl_primitive_attr_destroy(attr)
        raise
    return attr


class Primitive:
    """A created primitive and its execute arguments (memory objects kept here)."""

    def __init__(self, lib: Lib, pd, attr, args: list[tuple[int, Memory]], what: str):
        self.lib, self.h = lib, _V()
        try:
            lib.check(lib.d.dnnl_primitive_create(C.byref(self.h), pd), f"creating {what}")
        finally:
            lib.d.dnnl_primitive_desc_destroy(pd)
            if attr is not None:
                lib.d.dnnl_primitive_attr_destroy(attr)
        self.memories = [m for _, m in args]
        self.args = (_Arg * len(args))(*[_Arg(a, m.h) for a, m in args])
        self.n = len(args)
        self.what = what

    def run(self) -> None:
        self.lib.check(self.lib.execute(self.h, self.lib.stream, self.n, self.args), self.what)

    def __del__(self):
        try:
            self.lib.d.dnnl_primitive_destroy(self.h)
        except Exception:  # noqa: BLE001
            pass


_lock = threading.Lock()


@functools.cache
def _load() -> Lib | None:
    if platform.system() != "Linux" or platform.machine().lower() not in ("x86_64", "amd64"):
        return None
    if os.environ.get("AOT_NO_ONEDNN_PRIMITIVES") == "1":
        return None
    path = _library_path()
    if path is None:
        return None
    try:
        lib = Lib(path)
    except (OSError, DnnlError):
        return None
    return lib if lib.names_agree() else None


def lib() -> Lib | None:
    """The library, loaded once; None where it is missing or does not match."""
    with _lock:
        return _load()


def available() -> bool:
    return lib() is not None
