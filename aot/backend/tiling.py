"""A second compile of the program with data tiling and microkernels, to measure.

IREE 3.13's CPU matmuls without data tiling run several times slower than with it
(``tiling_flags.TILING_FLAGS``), which brings them
near ATen's. The same flags make depthwise-heavy convolution networks slower
(``benchmarks/flag_sweep.py`` compares flag sets per model). Flags are global to one IREE
compile, so the choice is per program, by measurement: where matmul-family ops
(linear, mm, bmm, matmul, addmm, baddbmm; under ``placement="coverage"`` also the
convolutions ``conv_rewrites`` emits as matmuls) carry at least ``MATMUL_SHARE`` of
the program's heavy FLOPs, the program is also partitioned as ``placement="coverage"``
does (everything IREE covers compiled: per-op cost probes take weights as inputs,
so under data tiling they pay a weight repacking per call that a compiled model
hoists into its initialiser) and compiled for a target with those flags
(``iree-tiled``), and timed end to end against the plain one:
among the region candidates under the default options, or against the plain
per-op artifact alone under ``placement="coverage"`` (the manifest's ``variant``
entry gives both times). A failing tiled compile is dropped (the plain one
stands). Never under ``fallback="all"`` (bit-exact round trip), the
``iree-default`` profile (IREE as it comes), or when the user already passed
data-tiling or microkernel flags.

Convolutions count under ``placement="coverage"``, where every convolution is compiled
and the tiled matmuls pay, and in two kinds of network under the default placement
(elsewhere the convolution networks' ATen regions win anyway, and the variant would
only add a large share to the compile time):

- a program with attention between its convolutions (MobileViT; EfficientFormer's
  written out as ``softmax(q @ k^T) @ v``): its linears and
  attention are transformer blocks, which the tiled variant runs well, and it
  compiles the convolutions as matmuls with the same data tiling;
- a depthwise network (``depthwise_network``: MobileNets, EfficientNets, ConvNeXt): its
  pointwise convolutions are matmuls over channels, its depthwise ones IREE's named
  channels-last convolution, and all compiled with data tiling it ran faster than the
  per-op placement on both of IREE's CPU drivers (MobileNetV3-Small 1.4-1.7 ms against
  1.8-1.9, EfficientNet-B0 5.8-8.0 against 7.4-10.8, ConvNeXt-atto 9.4-9.8 against
  10.7-11.7; ``benchmarks/dispatch_profile.py``).

Both are compiled alone (``tuning.compile._tiled_alone``), sparing the per-op costs and
program (``docs/performance.md`` has the figures).
The flags, and the two data-tiling paths of IREE 3.13 (one miscompiles dynamic shapes),
are ``aot.toolchain.tiling_flags``.
"""

from __future__ import annotations

import logging

import torch

from ..importer.program import ImportedProgram
from ..forms.conv_rewrites import as_matmul, is_depthwise
from ..partition.decisions import flat_ops
from ..partition.flops import node_flops
from ..partition.placement import PlacementPolicy
from ..toolchain.targets import Target
from ..toolchain.tiling_flags import DYNAMIC_UNSAFE, TILING_FLAGS

__all__ = ["MATMUL_SHARE", "depthwise_network", "worth_tiling"]
log = logging.getLogger(__name__)

MATMUL_SHARE = 0.5
_MATMULS = {"linear", "mm", "bmm", "matmul", "addmm", "baddbmm"}
_ATTENTION = {torch.ops.aten.scaled_dot_product_attention.default}


def _matmul_share(imported: ImportedProgram, convs: bool) -> float:
    """The share of heavy FLOPs in matmul-family ops, attention (compiled as two
    matmuls: ``attention_rewrites``) among them, and convolutions compiled as matmuls,
    with ``convs``; the ops inside control flow counted once each."""
    total = mm = 0.0
    for n in flat_ops(imported.exported):  # a loop's body too
        f = node_flops(n) or 0
        total += f
        if isinstance(n.target, torch._ops.OpOverload) and \
                n.target._schema.name.split("::")[-1] in _MATMULS or n.target in _ATTENTION \
                or convs and as_matmul(n):
            mm += f
    return mm / total if total else 0.0


def worth_tiling(imported: ImportedProgram, target: Target, policy: PlacementPolicy) -> bool:
    """A CPU program whose heavy FLOPs are mostly matmuls, flags not chosen by the user
    (convolutions compiled as matmuls count under ``placement="coverage"``, in a
    program with attention and in a depthwise network)."""
    if target.backend != "llvm-cpu" or policy.fallback == "all" or target.profile != "default":
        return False
    if any(f.startswith(DYNAMIC_UNSAFE + TILING_FLAGS[:1]
                        + ("--iree-llvmcpu-enable-ukernels",)) for f in target.flags):
        return False
    convs = policy.placement == "coverage" or _has_attention(imported) \
        or depthwise_network(imported)
    return _matmul_share(imported, convs=convs) >= MATMUL_SHARE


_SOFTMAX = {torch.ops.aten.softmax.int, torch.ops.aten._softmax.default}


def _has_attention(imported: ImportedProgram) -> bool:
    """Attention as one op, or written out (a softmax: EfficientFormer's and LeViT's
    ``softmax(q @ k^T) @ v``)."""
    return any(n.target in _ATTENTION or n.target in _SOFTMAX
               for n in flat_ops(imported.exported))


def depthwise_network(imported: ImportedProgram) -> bool:
    """Whether the program has a depthwise convolution among its ops."""
    return any(is_depthwise(n) for n in flat_ops(imported.exported))
