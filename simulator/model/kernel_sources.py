"""What the compiled kernel is made of, and where a build puts it compiled.

The kernel compiles functions of several files into itself (service times from
``kernel_service.py``, the table kind's interpolation, the spec_decode cost forms...; the
extension also carries the native trace reader's pass over call lines), so
whatever was compiled from them — numba's cache (:mod:`simulator.model.kernel_cache`), the
extension (:mod:`simulator.model.compiled`) — is valid only for the same content of all of
:data:`KERNEL_SOURCES`: :func:`sources_digest` is that content's digest. This module imports
no numba, so a process that runs the extension never loads it.
"""

from __future__ import annotations

import hashlib
import sys
from functools import cache
from pathlib import Path

PACKAGE = Path(__file__).resolve().parent.parent
#: The files whose code a compiled function of the package may include.
KERNEL_SOURCES = ("model/*.py", "model/rules/continuous.py", "model/rules/queue.py", "profile/*.py", "profile/kinds/*.py",
                  "trace/formats/native_scan.py", "summary_kernel.py", "summary_layout.py")
#: What a build compiled (``python -m simulator.model.precompile``): numba's index and data
#: files of every kernel function, in a folder per source folder (``model/``,
#: ``profile/kinds/``), and the extension with its own stamp.
COMPILED = PACKAGE / "model" / "_compiled"
#: The packaged numba cache's stamp: what it was compiled from and for.
STAMP = "stamp.json"


@cache
def sources_digest() -> str:
    """The digest of every kernel source file's name and content."""
    digest = hashlib.sha256()
    for pattern in KERNEL_SOURCES:
        for path in sorted(PACKAGE.glob(pattern)):
            digest.update(path.relative_to(PACKAGE).as_posix().encode() + b"\0" + path.read_bytes() + b"\0")
    return digest.hexdigest()


def python_tag() -> str:
    """The Python a compiled file is for, as numba names it in a cache file (``3.11``, with ABI flags)."""
    return f"{sys.version_info[0]}.{sys.version_info[1]}{getattr(sys, 'abiflags', '')}"
