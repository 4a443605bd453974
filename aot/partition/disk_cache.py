"""One JSON file of measurements per IREE version, target and key, on disk.

Shared by the coverage verdicts (``coverage``) and the ATen-vs-IREE costs
(``cost``): ``$AOT_CACHE_DIR`` or ``~/.cache/aot``, written atomically, and a
read-only home never stops compilation.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import re
import threading

import iree.compiler.version as iree_compiler_version

from ..toolchain.targets import Target

__all__ = ["JsonCache"]
log = logging.getLogger(__name__)
_lock = threading.Lock()


class JsonCache:
    """``{signature: record}`` in ``<dir>/<kind>-<iree version>-<target>-<hash>.json``."""

    def __init__(self, kind: str, target: Target, key: str = "", directory: str | None = None):
        directory = directory or os.environ.get("AOT_CACHE_DIR") or os.path.join(
            os.path.expanduser("~"), ".cache", "aot")
        via = "" if target.via == "torch" else f" via={target.via}"  # coverage differs per path
        digest = hashlib.sha256((" ".join(target.flags) + via + key).encode()).hexdigest()[:12]
        ver = getattr(iree_compiler_version, "VERSION",
                      getattr(iree_compiler_version, "PACKAGE_SUFFIX", "unknown"))
        name = re.sub(r"[^\w.-]", "_", target.name)  # cpu:aarch64-linux-gnu
        self.path = os.path.join(directory, f"{kind}-{ver}-{name}-{digest}.json")
        try:
            with open(self.path) as f:
                self.data: dict[str, dict] = json.load(f)
        except (OSError, ValueError):
            self.data = {}

    def update(self, records: dict[str, dict]) -> None:
        """Add ``records`` and write the file (atomically)."""
        self.data.update(records)
        try:
            os.makedirs(os.path.dirname(self.path), exist_ok=True)
            tmp = f"{self.path}.{os.getpid()}.tmp"
            with _lock, open(tmp, "w") as f:
                json.dump(self.data, f, indent=0, sort_keys=True)
            os.replace(tmp, self.path)
        except OSError as e:  # a read-only home must not stop compilation
            log.warning("could not write cache %s: %s", self.path, e)
