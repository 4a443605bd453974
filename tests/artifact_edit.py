"""Hand-editing artifact files as an attacker (or a buggy tool) would: the manifest
changed and every checksum recomputed, so only the loader's own checks stand."""

from __future__ import annotations

import hashlib
import json
import struct

HEADER = 7 + 4  # magic, format version


def sections(data: bytes) -> tuple[int, int]:
    """(start, end) of the manifest bytes in a version-3 file."""
    pos = HEADER + 32
    (n,) = struct.unpack_from("<Q", data, pos)
    return pos + 8, pos + 8 + n


def manifest_of(path: str) -> dict:
    data = open(path, "rb").read()
    start, end = sections(data)
    return json.loads(data[start:end])


def write_with_manifest(path: str, dst: str, body: bytes) -> str:
    """The artifact at ``path`` with manifest bytes ``body``, digest recomputed."""
    data = open(path, "rb").read()
    start, end = sections(data)
    rest = struct.pack("<Q", len(body)) + body + data[end:]
    with open(dst, "wb") as f:
        f.write(data[:HEADER] + hashlib.sha256(rest).digest() + rest)
    return dst


def rewrite(path: str, dst: str, edit) -> str:
    """The artifact at ``path`` with its manifest edited by ``edit`` (in place, on the
    parsed JSON) and checksummed again."""
    manifest = manifest_of(path)
    edit(manifest)
    return write_with_manifest(path, dst, json.dumps(manifest).encode())


def setter(path, value):
    """An ``edit`` that sets the manifest entry at ``path`` (keys and indices)."""
    def edit(m):
        obj = m
        for k in path[:-1]:
            obj = obj[k]
        obj[path[-1]] = value
    return edit
