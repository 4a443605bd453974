"""CompiledArtifact: one file holding the ``.vmfb`` and a JSON manifest.

File layout (all integers little-endian)::

    b"AOTART\\n"  magic (7 bytes)
    u32          format version (FORMAT_VERSION)
    u64          manifest length M
    M bytes      manifest, UTF-8 JSON
    rest         the IREE ``.vmfb``; its SHA-256 is in the manifest

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

from .errors import ArtifactError

__all__ = ["FORMAT_VERSION", "CompiledArtifact", "load_artifact"]

MAGIC = b"AOTART\n"
FORMAT_VERSION = 1
_HEADER = struct.Struct("<IQ")
_REQUIRED = ("format_version", "target", "driver", "flags", "torch_version", "iree_version",
             "inputs", "outputs", "in_spec", "out_spec", "kernel_calls", "placements",
             "vmfb_sha256", "name")


@dataclass(frozen=True)
class CompiledArtifact:
    """Made by ``compile_program`` (or :func:`load_artifact`); read by ``aot.runtime``."""

    vmfb: bytes
    manifest: dict[str, Any]

    def __post_init__(self):
        _validate(self.manifest, self.vmfb, "<in memory>")

    def to_bytes(self) -> bytes:
        body = json.dumps(self.manifest, sort_keys=True).encode()
        return MAGIC + _HEADER.pack(FORMAT_VERSION, len(body)) + body + self.vmfb

    def save(self, path: str) -> None:
        """Write the artifact to ``path`` (one file)."""
        with open(path, "wb") as f:
            f.write(self.to_bytes())


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
    if version != FORMAT_VERSION:
        raise ArtifactError(f"{path!r} has format version {version}; this aot reads version "
                            f"{FORMAT_VERSION}: recompile the model")
    start = len(MAGIC) + _HEADER.size
    if len(data) < start + mlen:
        raise ArtifactError(f"{path!r} is truncated (manifest needs {mlen} bytes, "
                            f"{len(data) - start} present)")
    try:
        manifest = json.loads(data[start:start + mlen])
    except ValueError as e:
        raise ArtifactError(f"{path!r}: manifest is not valid JSON ({e})") from e
    vmfb = data[start + mlen:]
    _validate(manifest, vmfb, path)
    return CompiledArtifact(vmfb, manifest)


def _validate(manifest: Any, vmfb: bytes, path: str) -> None:
    if not isinstance(manifest, dict):
        raise ArtifactError(f"{path!r}: manifest is not a JSON object")
    missing = [k for k in _REQUIRED if k not in manifest]
    if missing:
        raise ArtifactError(f"{path!r}: manifest lacks {', '.join(missing)}")
    if manifest["format_version"] != FORMAT_VERSION:
        raise ArtifactError(f"{path!r}: manifest format {manifest['format_version']} != "
                            f"{FORMAT_VERSION}")
    digest = hashlib.sha256(vmfb).hexdigest()
    if digest != manifest["vmfb_sha256"]:
        raise ArtifactError(f"{path!r} is corrupt or truncated: module checksum {digest[:12]}… "
                            f"does not match the manifest's {manifest['vmfb_sha256'][:12]}…")
