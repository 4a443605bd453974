"""load: an artifact file, opened by the runtime that can run it here.

With torch (the usual case), a :class:`~aot.runtime.module.CompiledModule`: torch
tensors in and out, kernel calls into ATen. Without torch, or with
``arrays="numpy"``, a :class:`~aot.runtime.numpy_module.NumpyModule`: numpy arrays in
and out, for an artifact that needs nothing but IREE's runtime. Either way the
file is validated (``aot.artifact``) and the host checked against the CPU it was
compiled for (``aot.runtime.host_cpu``) before IREE opens it.

The caller can also require integrity before a byte of the file is parsed: pin the
whole file's SHA-256 (``sha256=``), verify its signature (``verify=`` a public key;
``aot.signing``), refuse the legacy formats that have no whole-file digest
(``legacy=False``). See docs/security.md.
"""

from __future__ import annotations

import os

from ..artifact import CompiledArtifact, load_artifact, pinned_sha256
from ..errors import ArtifactError
from ..manifest import reading
from .generator import GENERATOR_FILE, CausalLMGenerator, check_entry_points, read_description

__all__ = ["load", "read_artifact", "ARRAYS"]
ARRAYS = ("torch", "numpy")


def load(path: str, *, strict_layout: bool = False, arrays: str | None = None,
         sha256: str | None = None, legacy: bool = True, verify: str | None = None,
         signature: str | None = None):
    """Load an artifact written by ``CompiledModule.save`` / ``aot compile``.

    Needs ``iree-base-runtime`` (never ``iree.compiler``), and torch unless the
    artifact's program is all compiled code.

    Args:
        strict_layout: an input in another memory layout than the compiled one is an
            ``InputMismatch`` instead of a counted conversion.
        arrays: ``"torch"`` (a CompiledModule: tensors in and out) or ``"numpy"`` (a
            NumpyModule: numpy arrays in and out, no torch needed). Default: torch
            where it can be imported, else numpy.
        sha256: the whole file's SHA-256 (hex, as ``aot compile`` / ``aot report``
            print it): any other file is refused before it is parsed.
        legacy: ``False`` refuses format versions 1 and 2 (no whole-file digest).
        verify: a public key (PEM file): the file must carry a valid signature by its
            private key (``aot sign``), checked before it is parsed; needs
            ``pip install 'aot[signing]'``. With ``sha256`` too, the signed file must
            be the pinned one.
        signature: the signature file (default ``path + ".sig"``); only with ``verify``.
    Raises:
        ArtifactError: missing, corrupt, truncated or incompatible file; compiled for
            a CPU this machine is not (architecture or features, both named); with
            numpy, an artifact that needs torch at run time (what needs it, named);
            not the pinned file, a malformed pin, a missing or bad signature, a legacy
            format with ``legacy=False``.
    """
    if os.path.isdir(path) and os.path.isfile(os.path.join(path, GENERATOR_FILE)):
        return _generator(path, arrays, strict_layout, sha256, verify)
    if arrays is None:
        arrays = "torch" if _has_torch() else "numpy"
    if arrays not in ARRAYS:
        raise ArtifactError(f"arrays={arrays!r}: choose one of {list(ARRAYS)}", stage="load")
    art = read_artifact(path, sha256=sha256, legacy=legacy, verify=verify,
                        signature=signature)
    if arrays == "numpy":
        from .numpy_module import NumpyModule
        return reading(path, "opening the module",
                       lambda: NumpyModule(art, strict_layout=strict_layout))
    if not _has_torch():
        raise ArtifactError("arrays='torch' needs torch, which this Python cannot import; "
                            "load with arrays='numpy'", stage="load")
    from .module import CompiledModule
    return reading(path, "opening the module",
                   lambda: CompiledModule(art, strict_layout=strict_layout))


def _generator(path, arrays, strict_layout, sha256, verify):
    """A folder ``CausalLMGenerator.save`` wrote (``aot.causal_lm``)."""
    if sha256 is not None or verify is not None:
        raise ArtifactError(f"{path!r} is a generator folder: pin or verify its files "
                            "(prefill.aot, decode.aot, prefill_long.aot) one by one",
                            stage="load")
    if arrays not in (None, "torch") or not _has_torch():
        raise ArtifactError(f"{path!r} is a generator folder: it runs with torch "
                            "(arrays='torch')", stage="load")
    meta = read_description(path)
    names = ["prefill", "decode"] + (["prefill_long"] if "long_prompt_from" in meta else [])
    prefill, decode, *long = (load(os.path.join(path, f"{name}.aot"),
                                   strict_layout=strict_layout) for name in names)
    check_entry_points(prefill, decode, meta, path, *long)
    return CausalLMGenerator(prefill, decode, meta, *long)


def read_artifact(path: str, *, sha256: str | None = None, legacy: bool = True,
                  verify: str | None = None, signature: str | None = None) -> CompiledArtifact:
    """The artifact at ``path``, read and validated (``aot.artifact.load_artifact``)
    after the integrity checks ``load`` describes (same arguments and errors)."""
    if signature is not None and verify is None:
        raise ArtifactError("signature= is checked only with verify=PUBLIC_KEY (the public "
                            "key to verify it with)", stage="load")
    pin = pinned_sha256(sha256)  # a malformed pin refused before the file is opened
    if verify is not None:
        from ..signing import verify as verify_signature
        signed = verify_signature(path, verify, signature)
        if pin is not None and pin != signed:
            raise ArtifactError(f"{path!r}: its signature vouches for a file with SHA-256 "
                                f"{signed[:16]}…, not the pinned {pin[:16]}…", stage="load")
        # the bytes parsed are the bytes that verified, even if the file changed since
        pin = signed
    return load_artifact(path, sha256=pin, legacy=legacy)


def _has_torch() -> bool:
    try:
        import torch  # noqa: F401
    except ImportError:
        return False
    return True
