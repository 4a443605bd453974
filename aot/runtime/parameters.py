"""The compiled module's weights, handed to IREE as parameters from the artifact.

A module compiled with ``Target.parameters`` reads each large weight from a global
whose value is the named parameter ``#stream.parameter.named<"aot"::"pN">``; the
manifest's ``parameters`` table gives each key's bytes within the artifact's
constants. Loading puts those bytes in an IREE parameter index (views, not copies)
and adds IREE's parameter module to the context, which resolves the globals when the
module initializes. Torch-free: the numpy runtime loads such modules too.
"""

from __future__ import annotations

import iree.runtime as rt

from ..manifest import Manifest, PARAMETER_SCOPE

__all__ = ["parameters_module"]


def parameters_module(instance: "rt.VmInstance", manifest: Manifest,
                      constants) -> "rt.VmModule | None":
    """IREE's parameter module serving ``manifest.parameters`` from ``constants``
    (checked against the manifest at load), or None where the module has none."""
    if not manifest.parameters:
        return None
    index = rt.ParameterIndex()
    view = memoryview(constants)
    for key, d in manifest.parameters.items():
        index.add_buffer(key, view[d["offset"]:d["offset"] + d["nbytes"]])
    return rt.create_io_parameters_module(instance, index.create_provider(scope=PARAMETER_SCOPE))
