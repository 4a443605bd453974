"""CompiledArtifact: one file holding the ``.vmfb`` and a JSON manifest.

File layout (all integers little-endian)::

    b"AOTART\\n"  magic (7 bytes)
    u32          format version (FORMAT_VERSION)
    u64          manifest length M
    M bytes      manifest, UTF-8 JSON
    u64          constants length C                    (version 2)
    C bytes      host-held constants, 64-byte aligned (version 2)
    rest         the IREE ``.vmfb``; its SHA-256 is in the manifest

Host-held constants are the weights only kernel calls read: ATen gets them
directly at run time (IREE would copy a constant on every call it crosses).
The manifest's ``host_constants`` gives each one's dtype, shape and offset,
and ``constants_sha256`` their checksum. Version 1 files (no constants) load.

The manifest records the target and driver, the flags, torch and IREE versions,
the input/output TorchTensors and pytree specs, the kernel-call table and the
placement table (for ``report``). ``load`` checks every field it relies on and
names what is wrong. This module never imports ``iree.compiler``.
"""

from __future__ import annotations

import hashlib
import json
import struct
from dataclasses import dataclass
from typing import Any

import torch

from .errors import ArtifactError

__all__ = ["FORMAT_VERSION", "CompiledArtifact", "load_artifact"]

MAGIC = b"AOTART\n"
FORMAT_VERSION = 2
_READS = (1, 2)
_HEADER = struct.Struct("<IQ")
_LEN = struct.Struct("<Q")
_ALIGN = 64
_REQUIRED = ("format_version", "target", "driver", "flags", "torch_version", "iree_version",
             "inputs", "outputs", "in_spec", "out_spec", "kernel_calls", "placements",
             "vmfb_sha256", "name")


@dataclass(frozen=True)
class CompiledArtifact:
    """Made by ``compile_program`` (or :func:`load_artifact`); read by ``aot.runtime``."""

    vmfb: bytes
    manifest: dict[str, Any]
    constants: bytes = b""

    def __post_init__(self):
        _validate(self.manifest, self.vmfb, "<in memory>", self.constants)

    def to_bytes(self) -> bytes:
        body = json.dumps(self.manifest, sort_keys=True).encode()
        return (MAGIC + _HEADER.pack(FORMAT_VERSION, len(body)) + body
                + _LEN.pack(len(self.constants)) + self.constants + self.vmfb)

    def host_constants(self, device: torch.device) -> dict[str, torch.Tensor]:
        """The host-held constants as tensors on ``device`` (views of one buffer on CPU)."""
        table = self.manifest.get("host_constants") or {}
        if not table:
            return {}
        buf = bytearray(self.constants)
        out = {}
        for name, d in table.items():
            dtype = getattr(torch, d["dtype"])
            raw = torch.frombuffer(buf, dtype=torch.uint8, count=d["nbytes"], offset=d["offset"]) \
                if d["nbytes"] else torch.empty(0, dtype=torch.uint8)
            out[name] = raw.view(dtype).reshape(d["shape"]).to(device)
        return out

    def save(self, path: str) -> None:
        """Write the artifact to ``path`` (one file)."""
        with open(path, "wb") as f:
            f.write(self.to_bytes())


def pack_constants(tensors: dict[str, torch.Tensor]) -> tuple[dict, bytes]:
    """``(table, blob)`` for the manifest's ``host_constants`` and the file's constants."""
    table, parts, offset = {}, [], 0
    for name, t in tensors.items():
        t = t.detach().to("cpu").contiguous()
        data = t.reshape(-1).view(torch.uint8).numpy().tobytes() if t.numel() else b""
        table[name] = {"dtype": str(t.dtype).removeprefix("torch."), "shape": list(t.shape),
                       "offset": offset, "nbytes": len(data)}
        pad = -len(data) % _ALIGN
        parts += [data, b"\0" * pad]
        offset += len(data) + pad
    return table, b"".join(parts)


def load_artifact(path: str) -> CompiledArtifact:
    """Read and validate an artifact file.

    Raises:
        ArtifactError: missing file, not an artifact, truncated, corrupt
            (checksum), or written by an incompatible format version.
    """
    try:
        with open(path, "rb") as f:
            data = f.read()
    except OSError as e:
        raise ArtifactError(f"cannot read artifact {path!r}: {e.strerror}") from e
    if not data.startswith(MAGIC):
        raise ArtifactError(f"{path!r} is not an aot artifact (bad magic bytes; expected a "
                            "file written by CompiledModule.save / `aot compile`)")
    if len(data) < len(MAGIC) + _HEADER.size:
        raise ArtifactError(f"{path!r} is truncated (header incomplete)")
    version, mlen = _HEADER.unpack_from(data, len(MAGIC))
    if version not in _READS:
        raise ArtifactError(f"{path!r} has format version {version}; this aot reads versions "
                            f"{', '.join(map(str, _READS))}: recompile the model")
    start = len(MAGIC) + _HEADER.size
    if len(data) < start + mlen:
        raise ArtifactError(f"{path!r} is truncated (manifest needs {mlen} bytes, "
                            f"{len(data) - start} present)")
    try:
        manifest = json.loads(data[start:start + mlen])
    except ValueError as e:
        raise ArtifactError(f"{path!r}: manifest is not valid JSON ({e})") from e
    rest, constants = start + mlen, b""
    if version >= 2:
        if len(data) < rest + _LEN.size:
            raise ArtifactError(f"{path!r} is truncated (no constants header)")
        (clen,) = _LEN.unpack_from(data, rest)
        rest += _LEN.size
        if len(data) < rest + clen:
            raise ArtifactError(f"{path!r} is truncated (constants need {clen} bytes, "
                                f"{len(data) - rest} present)")
        constants, rest = data[rest:rest + clen], rest + clen
    vmfb = data[rest:]
    _validate(manifest, vmfb, path, constants)
    return CompiledArtifact(vmfb, manifest, constants)


def _validate(manifest: Any, vmfb: bytes, path: str, constants: bytes = b"") -> None:
    if not isinstance(manifest, dict):
        raise ArtifactError(f"{path!r}: manifest is not a JSON object")
    missing = [k for k in _REQUIRED if k not in manifest]
    if missing:
        raise ArtifactError(f"{path!r}: manifest lacks {', '.join(missing)}")
    if manifest["format_version"] not in _READS:
        raise ArtifactError(f"{path!r}: manifest format {manifest['format_version']} is not "
                            f"one of {_READS}")
    if manifest.get("host_constants") and \
            hashlib.sha256(constants).hexdigest() != manifest.get("constants_sha256"):
        raise ArtifactError(f"{path!r} is corrupt or truncated: host constants do not match "
                            "the manifest's checksum")
    digest = hashlib.sha256(vmfb).hexdigest()
    if digest != manifest["vmfb_sha256"]:
        raise ArtifactError(f"{path!r} is corrupt or truncated: module checksum {digest[:12]}… "
                            f"does not match the manifest's {manifest['vmfb_sha256'][:12]}…")
