"""CompiledArtifact: one file holding the ``.vmfb`` and a JSON manifest.

File layout, format version 3 (all integers little-endian)::

    b"AOTART\n"  magic (7 bytes)
    u32          format version (FORMAT_VERSION)
    32 bytes     SHA-256 of every byte after these 32 (the body below)
    u64          manifest length M
    M bytes      manifest, UTF-8 JSON
    u64          constants length C
    C bytes      host-held constants, 64-byte aligned
    rest         the IREE ``.vmfb``

Every byte is covered: a change to the magic or the version is refused as such,
and any change to the digest or the body fails the digest at load, before a
byte of the manifest is believed (``ArtifactError``, never a wrong answer). A
manifest that is well-formed JSON and checksums but was edited by hand is then
validated field by field (``aot.manifest``). Version 2 files (no whole-file
digest: the manifest itself was not covered) and version 1 files (no constants)
still load, with the manifest's own checksums of the module and constants.

Host-held constants are the weights only kernel calls read: ATen gets them
directly at run time (IREE would copy a constant on every call it crosses).
The manifest's ``host_constants`` gives each one's dtype, shape and offset,
and ``constants_sha256`` their checksum.

The manifest records the target and driver, the flags, torch and IREE versions,
the input/output TorchTensors and pytree specs, the kernel-call table and the
placement table (for ``report``). This module never imports ``iree.compiler``, and
imports torch only where tensors are made: the torch-free runtime reads artifacts too.
"""

from __future__ import annotations

import hashlib
import json
import struct
import warnings
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from .errors import ArtifactError
from .limits import read_json
from .manifest import FORMAT_VERSION, READS, Manifest

if TYPE_CHECKING:
    import torch
    import torch.utils._pytree as pytree
__all__ = ["FORMAT_VERSION", "CompiledArtifact", "load_artifact"]

MAGIC = b"AOTART\n"
_VERSION = struct.Struct("<I")
_LEN = struct.Struct("<Q")
_DIGEST = 32
_ALIGN = 64


@dataclass(frozen=True)
class CompiledArtifact:
    """Made by ``compile_program`` (or :func:`load_artifact`); read by ``aot.runtime``.

    ``manifest``: a ``Manifest``, or its JSON document (checked and made one here).
    ``constants``: the host-held constants' bytes, read-only (``pack_constants`` and
    ``load_artifact`` give a read-only view, never a copy)."""

    vmfb: bytes
    manifest: Manifest
    constants: bytes | memoryview = b""
    # set by load_artifact, which has validated these very objects against the file
    _validated: bool = field(default=False, repr=False, compare=False)

    def __post_init__(self):
        if not isinstance(self.manifest, Manifest):
            object.__setattr__(self, "manifest",
                               Manifest.from_json(self.manifest, len(self.constants)))
        if not self._validated:
            _check_digests(self.manifest, self.vmfb, "<in memory>", self.constants)

    @classmethod
    def built(cls, vmfb: bytes, manifest: Manifest | dict, constants: bytes = b""
              ) -> "CompiledArtifact":
        """The artifact a builder just made, whose manifest's digests it computed from
        these very bytes: every field is checked, the digests are not computed again."""
        if not isinstance(manifest, Manifest):
            manifest = Manifest.from_json(manifest, len(constants))
        return cls(vmfb, manifest, constants, _validated=True)

    def with_manifest(self, **fields: Any) -> "CompiledArtifact":
        """This artifact with manifest ``fields`` set (a candidate's driver, executor or
        region, the compile's time): the new manifest is checked; the module and
        constants are these same bytes, already hashed, so their digests are not
        computed again."""
        if any(k in fields and fields[k] != getattr(self.manifest, k) for k in _DIGESTS):
            raise ValueError("with_manifest keeps the module and constants: not their digests")
        return CompiledArtifact.built(self.vmfb,
                                      self.manifest.replace(len(self.constants), **fields),
                                      self.constants)

    def to_bytes(self) -> bytes:
        manifest = json.dumps({**self.manifest.to_json(), "format_version": FORMAT_VERSION},
                              sort_keys=True).encode()
        body = (_LEN.pack(len(manifest)) + manifest + _LEN.pack(len(self.constants))
                + self.constants + self.vmfb)
        return MAGIC + _VERSION.pack(FORMAT_VERSION) + hashlib.sha256(body).digest() + body

    def host_constants(self, device: "torch.device") -> dict[str, "torch.Tensor"]:
        """The host-held constants as tensors on ``device``; on CPU, views of this
        artifact's own constants bytes, not a copy (hundreds of MB for a transformer,
        faulted in anew by every module built from it).

        The views are read-only by contract, as torch cannot mark a tensor so: a
        captured program is functional, a host program clones every buffer it updates
        into its own state, and a kernel call's outputs are its own memory, so nothing
        writes into a constant (``tests/runtime/test_constants_shared.py`` checks the
        bytes after runs)."""
        table = self.manifest.host_constants
        if not table:
            return {}
        import torch
        out = {}
        with warnings.catch_warnings():  # "the given buffer is not writable": see above
            warnings.simplefilter("ignore", UserWarning)
            for name, d in table.items():
                dtype = getattr(torch, d["dtype"])
                raw = torch.frombuffer(self.constants, dtype=torch.uint8, count=d["nbytes"],
                                       offset=d["offset"]) \
                    if d["nbytes"] else torch.empty(0, dtype=torch.uint8)
                out[name] = raw.view(dtype).reshape(d["shape"]).to(device)
        return out

    def save(self, path: str) -> None:
        """Write the artifact to ``path`` (one file)."""
        with open(path, "wb") as f:
            f.write(self.to_bytes())


def pack_constants(tensors: dict[str, "torch.Tensor"],
                   parameters: dict[str, "torch.Tensor"] | None = None
                   ) -> tuple[dict, dict, memoryview]:
    """``(table, parameter table, blob)``: the manifest's ``host_constants`` and
    ``parameters`` entries and the file's constants, which hold both. Every tensor is
    copied once, straight into one buffer, returned read-only."""
    import torch
    tables: tuple[dict, dict] = ({}, {})
    placed, offset = [], 0
    for table, group in zip(tables, (tensors, parameters or {})):
        for name, t in group.items():
            t = t.detach().to("cpu")
            nbytes = t.numel() * t.element_size()
            table[name] = {"dtype": str(t.dtype).removeprefix("torch."),
                           "shape": list(t.shape), "offset": offset, "nbytes": nbytes}
            placed.append((t, offset, nbytes))
            offset += nbytes + (-nbytes % _ALIGN)
    buf = bytearray(offset)  # zeros: the padding between constants
    if offset:
        flat = torch.frombuffer(buf, dtype=torch.uint8)
        for t, at, nbytes in placed:
            if nbytes:
                flat[at:at + nbytes].copy_(t.contiguous().reshape(-1).view(torch.uint8))
    return tables[0], tables[1], memoryview(buf).toreadonly()


def pinned_sha256(sha256: Any) -> str | None:
    """A caller's digest pin, lower-cased (None: no pin). Raises ArtifactError where it
    is not 64 hex digits."""
    if sha256 is None:
        return None
    if not isinstance(sha256, str) or len(sha256) != 2 * _DIGEST or \
            not set(sha256) <= set("0123456789abcdefABCDEF"):
        raise ArtifactError(f"sha256={sha256!r} is not a SHA-256 digest (64 hex digits, "
                            "as `aot report` prints it)")
    return sha256.lower()


def load_artifact(path: str, *, sha256: str | None = None,
                  legacy: bool = True) -> CompiledArtifact:
    """Read and validate an artifact file.

    Args:
        sha256: the whole file's SHA-256 (64 hex digits, either case), as
            :func:`file_sha256` or ``aot compile`` / ``aot report`` give it: any other
            file is refused before a byte of it is parsed.
        legacy: ``False`` refuses format versions 1 and 2 (no whole-file digest).
    Raises:
        ArtifactError: missing file, not an artifact, truncated, corrupt
            (checksum), or written by an incompatible format version; a file whose
            SHA-256 is not the pinned one, or a malformed pin; a legacy format
            with ``legacy=False``.
    """
    want = pinned_sha256(sha256)
    try:
        with open(path, "rb") as f:
            data = f.read()
    except OSError as e:
        raise ArtifactError(f"cannot read artifact {path!r}: {e.strerror}") from e
    if want is not None:
        got = hashlib.sha256(data).hexdigest()
        if got != want:
            raise ArtifactError(f"{path!r} is not the pinned file: its SHA-256 is {got[:16]}…, "
                                f"expected {want[:16]}… (a different build, or a modified file)")
    if not data.startswith(MAGIC):
        raise ArtifactError(f"{path!r} is not an aot artifact (bad magic bytes; expected a "
                            "file written by CompiledModule.save / `aot compile`)")
    if len(data) < len(MAGIC) + _VERSION.size:
        raise ArtifactError(f"{path!r} is truncated (header incomplete)")
    (version,) = _VERSION.unpack_from(data, len(MAGIC))
    if version not in READS:
        raise ArtifactError(f"{path!r} has format version {version}; this aot reads versions "
                            f"{', '.join(map(str, READS))}: recompile the model (or the file "
                            "is corrupt)")
    if not legacy and version < 3:
        raise ArtifactError(f"{path!r} has legacy format version {version}, which has no "
                            "whole-file digest (its manifest is not covered by a checksum); "
                            "refused with legacy=False: recompile the model (or save it "
                            "again) to write format 3")
    pos = len(MAGIC) + _VERSION.size
    if version >= 3:
        if len(data) < pos + _DIGEST:
            raise ArtifactError(f"{path!r} is truncated (no checksum)")
        digest, pos = data[pos:pos + _DIGEST], pos + _DIGEST
        if hashlib.sha256(memoryview(data)[pos:]).digest() != digest:
            raise ArtifactError(f"{path!r} is corrupt or truncated: its contents do not match "
                                "the file's SHA-256 checksum")
    manifest, pos = _read_section(data, pos, path, "manifest")
    manifest = read_json(bytes(manifest), f"{path!r}: manifest")
    constants, rest = b"", pos
    if version >= 2:
        constants, rest = _read_section(data, pos, path, "constants")
    vmfb = data[rest:]
    manifest = Manifest.from_json(manifest, len(constants), path)
    _check_digests(manifest, vmfb, path, constants)
    return CompiledArtifact(vmfb, manifest, constants, _validated=True)


def _read_section(data: bytes, pos: int, path: str, what: str) -> tuple[memoryview, int]:
    """``(u64-length-prefixed bytes at pos, the position after them)``, read-only."""
    if len(data) < pos + _LEN.size:
        raise ArtifactError(f"{path!r} is truncated (no {what} header)")
    (n,) = _LEN.unpack_from(data, pos)
    pos += _LEN.size
    if len(data) < pos + n:
        raise ArtifactError(f"{path!r} is truncated ({what} needs {n} bytes, "
                            f"{len(data) - pos} present)")
    return memoryview(data)[pos:pos + n], pos + n  # a view: constants are hundreds of MB


_DIGESTS = ("vmfb_sha256", "constants_sha256")


def _check_digests(manifest: Manifest, vmfb: bytes, path: str, constants: bytes) -> None:
    if (manifest.host_constants or manifest.parameters) and \
            hashlib.sha256(constants).hexdigest() != manifest.constants_sha256:
        raise ArtifactError(f"{path!r} is corrupt or truncated: host constants do not match "
                            "the manifest's checksum")
    digest = hashlib.sha256(vmfb).hexdigest()
    if digest != manifest.vmfb_sha256:
        raise ArtifactError(f"{path!r} is corrupt or truncated: module checksum {digest[:12]}… "
                            f"does not match the manifest's {manifest.vmfb_sha256[:12]}…")


def file_sha256(path_or_bytes: Any) -> str:
    """The SHA-256 (hex) of a whole file as it is on disk (a path), or of bytes: what
    ``load_artifact(path, sha256=...)`` pins.

    Raises:
        ArtifactError: the file cannot be read.
    """
    if isinstance(path_or_bytes, (bytes, bytearray, memoryview)):
        return hashlib.sha256(path_or_bytes).hexdigest()
    h = hashlib.sha256()
    try:
        with open(path_or_bytes, "rb") as f:
            while chunk := f.read(1 << 20):
                h.update(chunk)
    except OSError as e:
        raise ArtifactError(f"cannot read {str(path_or_bytes)!r}: {e.strerror}") from e
    return h.hexdigest()
