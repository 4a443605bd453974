"""A dynamic program's compiled code specialised at the example's sizes, in one module.

IREE's code for dynamic sizes is slower than its code for the same sizes known
at compile time (reductions such as layer norms lose the most). The example's
sizes are the ones the user said they call most (as a TensorRT profile's ``opt``
shape), so a dynamic
program whose chosen placement is all compiled code (no kernel calls) also gets
its static form at those sizes, as a second entry function of the same module:
``main`` (the dynamic program, every size in range) and ``main_at_example`` (the
example's sizes). The runtime calls ``main_at_example`` when every symbol is bound
to its example size, ``main`` otherwise.

One ``.vmfb``; nothing is compiled at call time, and a weight is one constant,
read by both functions (``lower_together``), so the module grows only by the second
function's code. (Not a ``torch.prim.If`` on the sizes inside one ``main``: with
data tiling, IREE's tiled code in such a static branch runs as slowly as the
dynamic code.) The static function is
the model imported again without ``dynamic_shapes`` (``ImportedProgram.at_example``),
partitioned with the chosen placement and compiled with the chosen flags; where it
would need a kernel call, the program is left as it is.

Which candidate gets it (``compile._specialized``): the ``iree-tiled`` variant where
it has no kernel calls, else the per-op artifact where it has none; one extra IREE
compile, before the candidates are measured, so the region
choice (``aot.tuning.regions``) times the specialised candidate at the example
against the ATen regions. Nothing in it is measured: a second compile builds the
same module. The manifest's ``specialized`` entry gives the function and the sizes;
``aot report`` says so.
"""

from __future__ import annotations

import hashlib
import logging
import time

from ..artifact import CompiledArtifact, pack_constants
from ..backend.lower import lower_together
from ..importer.fx_import import Parameters
from ..importer.program import ImportedProgram
from ..toolchain.iree_compile import try_compile
from ..partition.partitioner import partition
from ..partition.placement import PlacementPolicy
from ..passes.prepare import prepare
from ..toolchain.targets import Target

__all__ = ["worth_specializing", "specialize", "AT_EXAMPLE"]
log = logging.getLogger(__name__)

AT_EXAMPLE = "main_at_example"  # the static entry function


def worth_specializing(art: CompiledArtifact | None, imported: ImportedProgram) -> bool:
    """A dynamic program whose artifact is compiled code with no kernel call."""
    if art is None or not imported.symbols or imported.at_example is None or not art.vmfb:
        return False
    m = art.manifest
    return not m.kernel_calls and m.host_program is None \
        and all(pl["where"] == "compiled" for pl in m.placements)


def specialize(art: CompiledArtifact, imported: ImportedProgram, target: Target,
               policy: PlacementPolicy) -> CompiledArtifact:
    """``art`` with a second entry function, its program static at the example's sizes
    (module docstring); ``art`` itself where that cannot be built. ``imported``: the
    prepared program ``art`` was partitioned from; ``target``/``policy``: ``art``'s."""
    t0 = time.perf_counter()
    try:
        static, _ = prepare(imported.at_example(), policy)
        p_static = partition(static, target, policy)
        p_dyn = partition(imported, target, policy)
        if p_static.kernel_calls or p_dyn.kernel_calls:
            log.info("not specialised at the example: a form needs kernel calls")
            return art
        params = Parameters(by_contents=True) if target.parameters else None
        vmfb, diag = try_compile(lower_together({"main": p_dyn, AT_EXAMPLE: p_static}, params),
                                 target)
    except Exception as e:  # a specialisation is an optimisation: the plain one stands
        log.info("not specialised at the example: %s", e)
        return art
    if vmfb is None:
        log.info("not specialised at the example: IREE failed (%s)", diag.strip()[:200])
        return art
    entry = {"function": AT_EXAMPLE, "at": {s: e["example"] for s, e in imported.symbols.items()},
             "sizes": {e.get("name") or s: e["example"] for s, e in imported.symbols.items()},
             "kept": True, "compile_seconds": round(time.perf_counter() - t0, 2)}
    constants, fields = art.constants, {}
    if params is not None:  # both functions' weights (no kernel call: no host constants)
        _, table, constants = pack_constants({}, params.tensors)
        fields = {"parameters": table,
                  "constants_sha256": hashlib.sha256(constants).hexdigest()}
    manifest = art.manifest.replace(len(constants), specialized=entry,
                                    vmfb_sha256=hashlib.sha256(vmfb).hexdigest(), **fields)
    return CompiledArtifact.built(vmfb, manifest, constants)
