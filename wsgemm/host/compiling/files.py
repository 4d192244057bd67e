"""Private copies of bytes, for the loaders of the disk cache (``disk.link``: an object file the
DSL links; ``library.load``: a shared library tvm-ffi loads): a copy no other process can
change between the checksum and the load. An anonymous memory file where Linux has one, else a
0600 temporary file created here."""

from __future__ import annotations

import contextlib
import os
import tempfile
from collections.abc import Iterator


def write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view) :]


def memory_file(payload: bytes, name: str) -> tuple[int, str]:
    """(fd, path) of an anonymous memory file holding ``payload``; OSError where there is none."""
    if not hasattr(os, "memfd_create") or not os.path.isdir("/proc/self/fd"):
        raise OSError("no anonymous memory files here")
    fd = os.memfd_create(name, getattr(os, "MFD_CLOEXEC", 0))
    try:
        write_all(fd, payload)
    except OSError:
        os.close(fd)
        raise
    return fd, f"/proc/self/fd/{fd}"


def temporary_file(payload: bytes, prefix: str, suffix: str) -> str:
    """The path of a new 0600 temporary file holding ``payload`` (removed again on failure)."""
    fd, path = tempfile.mkstemp(prefix=prefix, suffix=suffix)
    try:
        write_all(fd, payload)
    except OSError:
        os.close(fd)
        os.unlink(path)
        raise
    os.close(fd)
    return path


@contextlib.contextmanager
def private_copy(payload: bytes) -> Iterator[str]:
    """A path to a private copy of ``payload`` for the time of the ``with`` block."""
    try:
        fd, path = memory_file(payload, "wsgemm-entry")
    except OSError:
        fd, path = None, temporary_file(payload, "wsgemm-entry-", ".o")
    try:
        yield path
    finally:
        if fd is not None:
            os.close(fd)
        else:
            with contextlib.suppress(OSError):
                os.unlink(path)
