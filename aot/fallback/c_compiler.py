"""Small C sources of our own compiled by the system C compiler, once per process.

``load(source, flags, what)`` writes ``source`` into a private temporary folder,
compiles it there as a shared library (``$CC``, split as a shell would, else ``cc``
or ``gcc``) and loads
it; the folder goes right after (the library stays mapped). Nothing is read from a
cache or an artifact: only the sources in this package are ever compiled. Where no
compiler works, ``load`` returns None and says why in the log; the callers then run
what they would have run without it.
"""

from __future__ import annotations

import ctypes as C
import logging
import os
import shlex
import shutil
import subprocess
import tempfile

__all__ = ["load", "load_kernel"]

log = logging.getLogger(__name__)


def load(source: str, flags: list[str], what: str) -> C.CDLL | None:
    """``source`` compiled with ``flags`` and loaded, or None (logged with ``what``)."""
    try:
        cc = shlex.split(os.environ.get("CC", ""))
    except ValueError as e:  # an unbalanced quote
        log.info("$CC is not a command line (%s): %s is not used", e, what)
        return None
    cc = cc or [shutil.which("cc") or shutil.which("gcc")]
    if not cc[0]:
        log.info("no C compiler found: %s is not used", what)
        return None
    with tempfile.TemporaryDirectory(prefix="aot-cc-") as tmp:
        src, lib = os.path.join(tmp, "src.c"), os.path.join(tmp, "lib.so")
        with open(src, "w") as f:
            f.write(source)
        try:
            subprocess.run([*cc, *flags, "-shared", "-fPIC", "-o", lib, src], check=True,
                           capture_output=True, timeout=120)
            return C.CDLL(lib)  # mapped: the folder may go
        except (OSError, subprocess.SubprocessError) as e:
            err = getattr(e, "stderr", b"") or b""
            log.info("%s did not compile with %s (%s%s): not used", what, " ".join(cc), e,
                     ": " + err.decode(errors="replace")[:300] if err else "")
            return None


def load_kernel(source: str, flags, what: str, name: str) -> C.CDLL | None:
    """``load``, with the C function ``name`` typed as this package's kernels are: one
    argument (the address of its arguments' struct), an ``int`` back (0: done)."""
    lib = load(source, list(flags), what)
    if lib is None:
        return None
    fn = getattr(lib, name)
    fn.argtypes, fn.restype = [C.c_void_p], C.c_int
    return lib
