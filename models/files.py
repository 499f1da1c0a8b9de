"""Files a user names (model specs, shard files, data files): only regular files are opened,
and a file read whole is checked against its limit before a byte of it is read.

A FIFO would block the reader forever, and a device such as ``/dev/zero`` (or a symlink to
one) never ends; both are refused with one line, as a folder or a missing file is. Data files
are read in parts (memory-mapped, by row group, by byte range), so only their kind is
checked before they are opened; their readers check sizes against what the file holds
(:func:`npy_header` for ``.npy`` files and ``.npz`` members: :func:`load_npy`,
:func:`load_npz`, and the prepared datasets of ``executors.datafiles``).
"""

from __future__ import annotations

import os
import stat
import zipfile
from pathlib import Path

import numpy as np

from .data import Data, flatten, unflatten
from .errors import DataError, EmgridError

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


def npy_header(f, where: str, size: int) -> tuple[tuple, bool, np.dtype, int]:
    """``(shape, fortran, dtype, header bytes)`` of the ``.npy`` stream ``f`` (at its start),
    of ``size`` bytes in all; DataError naming ``where`` when it is no ``.npy``, its header is
    damaged, it holds Python objects, or it holds fewer bytes than its header claims."""
    fmt = np.lib.format
    try:
        version = fmt.read_magic(f)
    except ValueError:
        raise DataError(f"{where} is not a .npy file ({'empty' if size == 0 else 'no NumPy magic at its start'})") from None
    try:
        read_header = fmt.read_array_header_1_0 if version == (1, 0) else fmt.read_array_header_2_0
        shape, fortran, dtype = read_header(f)
    except (ValueError, EOFError, SyntaxError) as e:
        raise DataError(f"{where} has a damaged .npy header ({str(e).splitlines()[0][:120]})") from None
    header = f.tell()
    if dtype.hasobject:
        raise DataError(f"{where} holds Python objects ({dtype}), not numbers; emgrid does not unpickle data")
    claimed = dtype.itemsize * int(np.prod(shape, dtype=object))
    if size - header < claimed:
        raise DataError(f"{where} is truncated: its header claims shape {tuple(shape)} of {dtype} "
                        f"({claimed:,} bytes), the file holds {size - header:,} bytes after the header")
    return tuple(shape), fortran, dtype, header


def load_npy(path) -> np.ndarray:
    """A ``.npy`` file of numbers, memory-mapped; DataError naming the file and what is wrong
    (a folder, a FIFO or device, not a ``.npy`` file, a truncated header, Python objects,
    fewer bytes than its header claims)."""
    p = Path(path)
    size = regular_file(p, "data file", DataError)
    try:
        with open(p, "rb") as f:
            shape, _, dtype, _ = npy_header(f, repr(str(p)), size)
    except OSError as e:
        raise DataError(f"cannot read {str(p)!r}: {e.strerror}") from None
    try:
        if dtype.itemsize * int(np.prod(shape, dtype=object)) == 0:
            return np.load(p, allow_pickle=False)
        return np.load(p, mmap_mode="r", allow_pickle=False)
    except (ValueError, OSError, EOFError) as e:
        raise DataError(f"cannot read {str(p)!r}: {str(e).splitlines()[0][:160]}") from None


def load_npz(path) -> Data:
    """The data of a ``.npz`` file (``models.data.unflatten``'s layout); DataError naming the
    file and what is wrong (a folder, a FIFO or device, not a zip archive, a member that is no
    ``.npy``, is pickled or holds fewer bytes than its header claims, arrays the layout does
    not use). Each member's header is checked against the member's size before it is read."""
    p = Path(path)
    regular_file(p, "data file", DataError)
    try:
        if not zipfile.is_zipfile(p):
            raise DataError(f"{str(p)!r} is not a .npz file (not a zip archive, or truncated)")
        with zipfile.ZipFile(p) as zf:
            for info in zf.infolist():
                if info.filename.endswith(".npy"):
                    with zf.open(info) as m:
                        npy_header(m, f"{str(p)!r}: array {info.filename[:-4]!r}", info.file_size)
        with np.load(p, allow_pickle=False) as z:
            arrays = {}
            for k in z.files:
                try:
                    arrays[k] = z[k]
                except (ValueError, OSError, EOFError, zipfile.BadZipFile) as e:
                    raise DataError(f"{str(p)!r}: array {k!r} cannot be read "
                                    f"({str(e).splitlines()[0][:120]})") from None
    except (OSError, zipfile.BadZipFile, EOFError) as e:
        raise DataError(f"cannot read {str(p)!r}: {getattr(e, 'strerror', None) or str(e).splitlines()[0][:120]}") from None
    data = unflatten(arrays)
    extra = sorted(set(arrays) - set(flatten(data)))
    if extra:
        raise DataError(f"{str(p)!r} has arrays the data layout does not use: {', '.join(extra[:8])}"
                        f"{' ...' if len(extra) > 8 else ''} (it reads {', '.join(sorted(flatten(data))[:8])})")
    return data
