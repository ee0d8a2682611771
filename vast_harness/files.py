"""Reading a small file the user or another process controls, and appending to one, without trusting what the
path is.

A path may name a FIFO (an open blocks until a writer comes, or a reader), `/dev/zero` or a link to it (a read
never ends), a directory, a dangling link, or a file of gigabytes. `read_regular_file` and `open_append` open
without blocking and check the opened object is a regular file (`read_regular_file` reads at most
`max_bytes`): every odd case is an `UnusableFile` naming what the path turned out to be, for the caller to say
and skip or refuse. Standard library only (a leaf).
"""

from __future__ import annotations

import errno
import fcntl
import os
import stat
from pathlib import Path
from typing import BinaryIO


class UnusableFile(OSError):
    """The path is not a regular file of a usable size; `str()` says what it is instead."""


def kind_of(mode: int) -> str:
    for test, name in ((stat.S_ISDIR, "a directory"), (stat.S_ISFIFO, "a FIFO"), (stat.S_ISCHR, "a device"),
                       (stat.S_ISBLK, "a block device"), (stat.S_ISSOCK, "a socket"), (stat.S_ISLNK, "a link")):
        if test(mode):
            return name
    return "not a regular file"


def read_regular_file(path: Path, *, max_bytes: int, follow_symlinks: bool = True) -> bytes:
    """The bytes of `path` if it is a regular file of at most `max_bytes`; else `UnusableFile` (or the
    OSError of the open: FileNotFoundError for a path that is not there at all)."""
    flags = os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0)
    if not follow_symlinks:
        flags |= getattr(os, "O_NOFOLLOW", 0)
    try:
        fd = os.open(path, flags)
    except FileNotFoundError:
        if os.path.lexists(path):
            raise UnusableFile(errno.ENOENT, "a link to nothing (dangling symlink)", str(path)) from None
        raise
    except OSError as exc:
        if exc.errno == errno.ELOOP and not follow_symlinks:
            raise UnusableFile(errno.ELOOP, "a symbolic link (refused: it may point anywhere)", str(path)) from None
        raise
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise UnusableFile(errno.EINVAL, kind_of(st.st_mode), str(path))
        if st.st_size > max_bytes:
            raise UnusableFile(errno.EFBIG, f"{st.st_size:,} bytes, over the {max_bytes:,}-byte limit", str(path))
        chunks, left = [], max_bytes + 1
        while left > 0:
            chunk = os.read(fd, min(left, 1 << 16))
            if not chunk:
                break
            chunks.append(chunk)
            left -= len(chunk)
        data = b"".join(chunks)
        if len(data) > max_bytes:  # grew since the fstat
            raise UnusableFile(errno.EFBIG, f"over the {max_bytes:,}-byte limit", str(path))
        return data
    finally:
        os.close(fd)


def open_append(path: Path, mode: int = 0o600) -> BinaryIO:
    """`path` opened to append bytes, created `mode` if missing; `UnusableFile` when it is not a regular file
    (a FIFO planted in the evidence directory would hold the open, and then every write, until a reader came)
    or is a symbolic link."""
    flags = (os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_NONBLOCK | getattr(os, "O_NOFOLLOW", 0)
             | getattr(os, "O_CLOEXEC", 0))
    try:
        fd = os.open(path, flags, mode)
    except OSError as exc:
        if exc.errno == errno.ENXIO:  # a FIFO no process reads
            raise UnusableFile(errno.ENXIO, "a FIFO", str(path)) from None
        if exc.errno == errno.ELOOP:
            raise UnusableFile(errno.ELOOP, "a symbolic link (refused: it may point anywhere)", str(path)) from None
        raise
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise UnusableFile(errno.EINVAL, kind_of(st.st_mode), str(path))
        fcntl.fcntl(fd, fcntl.F_SETFL, fcntl.fcntl(fd, fcntl.F_GETFL) & ~os.O_NONBLOCK)
        return os.fdopen(fd, "ab")
    except BaseException:
        os.close(fd)
        raise
