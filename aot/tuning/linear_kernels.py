"""Which kernel runs each float32 linear of a prepacked ATen region: measured per machine.

The prepacked executor (``aot.fallback.prepack``) has two kernels for a linear on a
constant weight: oneDNN's (``mkldnn._linear_pointwise`` on a weight reordered once, an
activation fused as a post-op) and MKL's (``mkl._mkl_linear`` on a weight packed once
for the batch, the activation in place after it). Neither wins everywhere. On an AMD
Zen 5 MKL takes its AVX2 path and oneDNN runs 1.3-2.3x faster; on an Intel Xeon
(2 cores, AVX-512) MKL's packed weight is 1.1-1.8x faster on most of ViT's, BERT's and
LeViT's products (16x384x768: 64 us against 96; 197x768x2304: 3.5 ms against 4.0) and
oneDNN ahead on others (128x768x768: 0.73 ms against 0.81).

So at compile each distinct linear of the ``aten-prepacked`` candidate (rows, in, out,
bias, fused activation: ``prepack.linear_signature``) is timed both ways on random data,
interleaved, and the candidate's executor lists those that run faster on MKL
(``ExecOptions.mkl_linears``). The times are kept per machine beside the other
measurements, so a later compile (a region decision reused) makes the same choice; the
region race then times the candidate as a whole against the others.

A 1x1 convolution (stride 1, no padding, one group) on channels-last data is a linear
over its pixels, so it is chosen the same way (``prepack.conv1x1_signature``): oneDNN's
convolution with its add and activation fused, against MKL's linear with them after it
(on the Xeon MKL takes MobileNetV2's 49x960x160 in 114 us against 182, and loses on
its 12544x16x96, 678 us against 513).
"""

from __future__ import annotations

import logging

import torch

from .. import timing
from ..artifact import CompiledArtifact
from ..fallback import prepack
from ..partition.cost import machine_key
from ..partition.disk_cache import JsonCache
from ..progress import step
from ..runtime.module import CompiledModule
from ..toolchain.targets import Target

__all__ = ["chosen", "choose", "sites", "timed", "timed_conv1x1", "MKL_MARGIN"]
log = logging.getLogger(__name__)

MKL_MARGIN = 0.95  # MKL where it takes at most this share of oneDNN's time (ties: oneDNN)
_BLOCK_MS = 20.0  # each timed block of calls lasts about this long
_ROUNDS = 5


def sites(art: CompiledArtifact) -> dict[str, object]:
    """``{signature: kernel}``: the linears of a static batch that ``art``'s prepacked
    executor runs (``prepack.OneDnnLinear`` / ``PackedLinear``, as its groups plan
    them) and its 1x1 convolutions (``prepack.PackedConv`` with a signature), one per
    signature."""
    m = CompiledModule(art)
    try:
        found = {}
        for fn in m.host.functions.values():
            for f in (getattr(fn, "fused", None) or {}).values():
                if isinstance(f, (prepack.OneDnnLinear, prepack.PackedLinear)) \
                        and f.batch is not None:
                    found.setdefault(f.signature, f)
                elif isinstance(f, prepack.PackedConv) and f.signature is not None:
                    found.setdefault(f.signature, f)
        return found
    finally:
        m.close()


def timed(batch: int, k: int, n: int, bias: bool, post_op) -> dict[str, float]:
    """``{"onednn": ms, "mkl": ms}``: a ``batch x k`` by ``n x k`` linear (with a bias,
    then ``post_op`` where given) on random data, each kernel as the prepacked executor
    runs it, the two interleaved (medians of ``_ROUNDS`` blocks each)."""
    x = torch.rand(batch, k) - 0.5
    w = (torch.rand(n, k) - 0.5) / k ** 0.5
    b = torch.rand(n) if bias else None
    attr, scalars, algorithm = (post_op.attr, post_op.scalars, post_op.algorithm) \
        if post_op is not None else ("none", [], "")
    reordered = prepack.onednn_linear_weight(w, batch)
    packed = torch.ops.mkl._mkl_reorder_linear_weight(w, batch)

    def onednn():
        torch.ops.mkldnn._linear_pointwise(x, reordered, b, attr, scalars, algorithm)

    def mkl():
        y = torch.ops.mkl._mkl_linear(x, packed, w, b, batch)
        if post_op is not None:
            post_op.apply(y, scalars, algorithm)

    return _race(onednn, mkl)


def timed_conv1x1(n: int, c: int, h: int, w: int, o: int, bias: bool, add: bool,
                  post_op) -> dict[str, float]:
    """``{"onednn": ms, "mkl": ms}``: a 1x1 convolution of a channels-last ``n x c x h
    x w`` input to ``o`` channels (a bias, a residual add, ``post_op`` where given),
    as ``prepack.PackedConv`` and ``MklConv1x1`` run it, on random data."""
    cl = torch.channels_last
    x = (torch.rand(n, c, h, w) - 0.5).contiguous(memory_format=cl)
    weight = (torch.rand(o, c, 1, 1) - 0.5) / c ** 0.5
    b = torch.rand(o) if bias else None
    other = torch.rand(n, o, h, w).contiguous(memory_format=cl) if add else None
    attr, scalars, algorithm = (post_op.attr, post_op.scalars, post_op.algorithm) \
        if post_op is not None else ("none", [], "")
    rows, flat = n * h * w, weight.reshape(o, c)
    reordered = torch.ops.mkldnn._reorder_convolution_weight(
        weight, [0, 0], [1, 1], [1, 1], 1, [n, c, h, w])
    packed = torch.ops.mkl._mkl_reorder_linear_weight(flat, rows)
    geometry = ([0, 0], [1, 1], [1, 1], 1)

    def onednn():
        if other is None:
            torch.ops.mkldnn._convolution_pointwise(x, reordered, b, *geometry, attr, scalars,
                                                    algorithm)
        else:
            torch.ops.mkldnn._convolution_pointwise.binary(
                x, other, reordered, b, *geometry, "add", 1.0,
                None if attr == "none" else attr, [], "")

    def mkl():
        y = torch.ops.mkl._mkl_linear(x.permute(0, 2, 3, 1).reshape(rows, c), packed, flat, b,
                                      rows)
        if other is not None:
            y.add_(other.permute(0, 2, 3, 1).reshape(rows, o))
        if post_op is not None:
            post_op.apply(y, scalars, algorithm)

    return _race(onednn, mkl)


def _race(onednn, mkl) -> dict[str, float]:
    with torch.no_grad():
        once = max(min(timing.block(onednn, 1)[0], timing.block(mkl, 1)[0]), 1e-3)
        calls = max(2, min(20, int(_BLOCK_MS / once)))
        samples = timing.interleaved({"onednn": onednn, "mkl": mkl}, _ROUNDS, calls,
                                     warmup=1)
    return timing.medians(samples)


def _cache(target: Target) -> JsonCache:
    return JsonCache("linear-kernels", target, key=f"{machine_key()}|prepack{prepack.VERSION}")


def chosen(cands: dict[str, CompiledArtifact], target: Target) -> dict[str, CompiledArtifact]:
    """``cands`` with the ``aten-prepacked`` candidate's linear kernels chosen
    (``choose``), where that was not done yet. Called where no compile runs beside the
    timing."""
    art = cands.get("aten-prepacked")
    if art is None or "mkl_linears" in (art.manifest.executor or {}):
        return cands
    return {**cands, "aten-prepacked": choose(art, target)}


def choose(art: CompiledArtifact, target: Target) -> CompiledArtifact:
    """``art`` (a prepacked candidate) with its executor's ``mkl_linears``: the linear
    signatures measured faster on MKL on this machine (``MKL_MARGIN``), an empty list
    where none is (or where this torch lacks either kernel): the key says the choice
    was made."""
    executor = dict(art.manifest.executor or {})
    if not (prepack.onednn_linear_available() and prepack.mkl_linear_available()):
        return art.with_manifest(executor={**executor, "mkl_linears": []})
    try:
        found = sites(art)
    except Exception as e:  # a choice of kernels is an optimisation: oneDNN stands
        log.info("could not list the prepacked linears: %s", e)
        return art.with_manifest(executor={**executor, "mkl_linears": []})
    if not found:
        return art.with_manifest(executor={**executor, "mkl_linears": []})
    cache = _cache(target)
    todo = {s: f for s, f in found.items() if s not in cache.data}
    if todo:
        step("timing %d linear and 1x1 convolution shape(s) on oneDNN and on MKL (once per "
             "machine, then cached)", len(todo))
        fresh = {}
        for sig, f in todo.items():
            try:
                if isinstance(f, prepack.PackedConv):
                    *shape, bias = prepack.conv1x1_shape(f.spec)
                    fresh[sig] = timed_conv1x1(*shape, bias, f.other_slot is not None,
                                               f.post_op)
                else:
                    k, n, bias = prepack.linear_shape(f.spec)
                    fresh[sig] = timed(f.batch, k, n, bias, f.post_op)
            except Exception as e:  # not measured: oneDNN stands for it
                log.info("could not time linear %s: %s", sig, e)
        cache.update(fresh)
    mkl = sorted(s for s in found if (t := cache.data.get(s))
                 and t["mkl"] <= MKL_MARGIN * t["onednn"])
    return art.with_manifest(executor={**executor, "mkl_linears": mkl})
