"""Files a user names (model specs, shard files, data files): only regular files are opened,
and a file read whole is checked against its limit before a byte of it is read.

A FIFO would block the reader forever, and a device such as ``/dev/zero`` (or a symlink to
one) never ends; both are refused with one line, as a folder or a missing file is. Data files
are read in parts (memory-mapped, by row group, by byte range), so only their kind is
checked here; their readers check sizes against what the file holds.
"""

from __future__ import annotations

import os
import stat
from pathlib import Path

from .errors import EmgridError

#: The largest JSON file read whole: a model spec, a sharded model's root or one shard file.
#: JSON takes several times its size in memory once parsed; a model larger than this is
#: written shard by shard (``models.sharded``), each file within the limit.
MAX_SPEC_FILE_BYTES = 1 << 30

_KINDS = ((stat.S_ISDIR, "a folder"), (stat.S_ISFIFO, "a FIFO (named pipe)"), (stat.S_ISCHR, "a character device"),
          (stat.S_ISBLK, "a block device"), (stat.S_ISSOCK, "a socket"))


def _kind(mode: int) -> str:
    return next((name for test, name in _KINDS if test(mode)), "not a regular file")


def _where(path) -> str:
    return repr(str(path))


def regular_file(path, what: str, error: type[EmgridError]) -> int:
    """The size of ``path`` (symlinks followed), or ``error`` naming ``what`` and the file
    when it is missing or not a regular file."""
    try:
        st = os.stat(path)
    except ValueError:  # an embedded NUL
        raise error(f"{what} {_where(path)} is not a usable file name (it holds a NUL byte)") from None
    except OSError as e:
        raise error(f"cannot read {what} {_where(path)}: {e.strerror or type(e).__name__}") from None
    if not stat.S_ISREG(st.st_mode):
        raise error(f"{what} {_where(path)} is {_kind(st.st_mode)}, not a regular file; emgrid reads regular "
                    "files only")
    return int(st.st_size)


def read_bytes(path, what: str, error: type[EmgridError], limit: int = MAX_SPEC_FILE_BYTES) -> bytes:
    """The whole of a regular file of at most ``limit`` bytes. It is opened without blocking
    and checked on the open descriptor, so a FIFO put in its place after a check never
    blocks the reader."""
    path = Path(path)
    try:
        fd = os.open(path, os.O_RDONLY | getattr(os, "O_NONBLOCK", 0))
    except ValueError:
        raise error(f"{what} {_where(path)} is not a usable file name (it holds a NUL byte)") from None
    except OSError as e:
        raise error(f"cannot read {what} {_where(path)}: {e.strerror or type(e).__name__}") from None
    with os.fdopen(fd, "rb") as f:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise error(f"{what} {_where(path)} is {_kind(st.st_mode)}, not a regular file; emgrid reads regular "
                        "files only")
        if st.st_size > limit:
            raise error(f"{what} {_where(path)} holds {st.st_size:,} bytes, more than the {limit:,} a file read "
                        "whole may hold (models.files.MAX_SPEC_FILE_BYTES)")
        try:
            data = f.read(st.st_size + 1)  # one byte more tells whether it grew since the check
        except OSError as e:
            raise error(f"cannot read {what} {_where(path)}: {e.strerror or type(e).__name__}") from None
    if len(data) > st.st_size:
        raise error(f"{what} {_where(path)} grew while it was read; read it again once it is written")
    return data


def read_text(path, what: str, error: type[EmgridError], limit: int = MAX_SPEC_FILE_BYTES) -> str:
    """:func:`read_bytes` decoded as UTF-8; text that is not is refused naming the first bad byte."""
    data = read_bytes(path, what, error, limit)
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as e:
        line = data.count(b"\n", 0, e.start) + 1
        raise error(f"{what} {_where(path)} is not UTF-8 text: byte 0x{data[e.start]:02x} at offset {e.start} "
                    f"(line {line})") from None
