"""plain_module: may an artifact's IREE module run on IREE's runtime alone?

A plain module (``aot.export_vmfb``, ``aot compile --emit vmfb``) is the artifact's
``.vmfb`` handed out as it is: IREE's tools (``iree-run-module``) and runtime call its
``main`` with the model's tensor inputs and get its outputs. That holds only when the
program needs nothing of this package at run time: no kernel call (a host function
it imports), and no in-place update of an input (the runtime here writes it back).
"""

from __future__ import annotations

from ..errors import UnsupportedOp

__all__ = ["check_plain", "plain_vmfb"]


def plain_vmfb(imported, target) -> bytes:
    """The program's IREE module with every op compiled (``placement="coverage"``),
    checked plain (``check_plain``): what ``export_vmfb`` and ``--emit vmfb`` write."""
    from .compile import compile_model
    from .placement import PlacementPolicy
    art = compile_model(imported, target, PlacementPolicy.make("auto", (), "coverage", None))
    check_plain(art.manifest)
    return art.vmfb


def check_plain(manifest: dict) -> None:
    """Raise UnsupportedOp naming every op that keeps ``manifest``'s module from
    running on IREE's runtime alone."""
    calls = [p for p in manifest.get("placements", []) if p.get("where") == "kernel_call"]
    if calls:
        lines = "\n".join(f"  {p['op']}  at {p.get('location') or '?'}: {p.get('reason', '')}"
                          for p in calls[:40])
        more = f"\n  ... and {len(calls) - 40} more" if len(calls) > 40 else ""
        raise UnsupportedOp(
            f"{len(calls)} op(s) would run in ATen through kernel calls, which only this "
            f"package's runtime provides, so the module cannot run on IREE's runtime "
            f"alone:\n{lines}{more}\n"
            "To see why each op is not compiled, compile with fallback='none' (every op "
            "IREE cannot lower, listed); to get rid of them, replace those ops in the "
            "model, or deploy the .aot artifact with aot.load instead.")
    if manifest.get("mutations"):
        raise UnsupportedOp("the program updates its inputs in place (buffers or "
                            "arguments), which a plain IREE module cannot do to the "
                            "caller's tensors; deploy the .aot artifact with aot.load")
