"""SFTP for a simulated host: the real filesystem, relative paths under the sandbox HOME, metered.

As with OpenSSH, an absolute path is taken as is and a relative one starts at HOME (`canonicalize(".")`
is HOME). Bytes read and written are reported to a meter, which bills bandwidth and can throttle
(the slow_sftp fault).
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from pathlib import Path
from typing import IO, TYPE_CHECKING, Any

import paramiko
from paramiko.sftp import SFTP_FAILURE, SFTP_OK

if TYPE_CHECKING:
    from _typeshed import ReadableBuffer


class Meter:
    """Counts SFTP bytes per direction and sleeps to hold `bytes_per_s` when throttled."""

    def __init__(self, on_bytes: Callable[[int, int], None], bytes_per_s: int | None = None) -> None:
        self.on_bytes = on_bytes  # (written_to_host, read_from_host)
        self.bytes_per_s = bytes_per_s

    def count(self, written: int, read: int) -> None:
        if self.bytes_per_s:
            time.sleep((written + read) / self.bytes_per_s)
        self.on_bytes(written, read)


class _MeteredHandle(paramiko.SFTPHandle):
    # Set by SandboxSFTP.open; paramiko's SFTPHandle reads and writes through them (its stub leaves them out).
    filename: str
    readfile: IO[bytes]
    writefile: IO[bytes]

    def __init__(self, flags: int, meter: Meter) -> None:
        super().__init__(flags)
        self.meter = meter

    def read(self, offset: int, length: int) -> bytes | int:
        data = super().read(offset, length)
        if isinstance(data, bytes):
            self.meter.count(0, len(data))
        return data

    def write(self, offset: int, data: ReadableBuffer) -> int:
        result = super().write(offset, data)
        if result == SFTP_OK:
            self.meter.count(memoryview(data).nbytes, 0)
        return result


def _errno(exc: OSError) -> int:
    if exc.errno is None:
        return SFTP_FAILURE  # what convert_errno answers for any errno it does not name
    return paramiko.SFTPServer.convert_errno(exc.errno)


class SandboxSFTP(paramiko.SFTPServerInterface):
    """paramiko's SFTP server interface over the real filesystem, relative paths under `home`."""

    def __init__(self, server: Any, *args: Any, home: Path, meter: Meter, **kwargs: Any) -> None:
        super().__init__(server, *args, **kwargs)
        self.home = home
        self.meter = meter

    def _real(self, path: str) -> str:
        return os.path.normpath(os.path.join(self.home, path))

    def canonicalize(self, path: str) -> str:
        return self._real(path or ".")

    def list_folder(self, path: str) -> list[paramiko.SFTPAttributes] | int:
        real = self._real(path)
        try:
            return [paramiko.SFTPAttributes.from_stat(os.lstat(os.path.join(real, name)), name)
                    for name in os.listdir(real)]
        except OSError as exc:
            return _errno(exc)

    def stat(self, path: str) -> paramiko.SFTPAttributes | int:
        try:
            return paramiko.SFTPAttributes.from_stat(os.stat(self._real(path)))
        except OSError as exc:
            return _errno(exc)

    def lstat(self, path: str) -> paramiko.SFTPAttributes | int:
        try:
            return paramiko.SFTPAttributes.from_stat(os.lstat(self._real(path)))
        except OSError as exc:
            return _errno(exc)

    def open(self, path: str, flags: int, attr: paramiko.SFTPAttributes) -> paramiko.SFTPHandle | int:
        real = self._real(path)
        mode = getattr(attr, "st_mode", None) or 0o644
        try:
            fd = os.open(real, flags | getattr(os, "O_BINARY", 0), mode & 0o7777)
        except OSError as exc:
            return _errno(exc)
        if flags & os.O_CREAT and attr is not None:
            # The mode is already applied by os.open. _flags is private to paramiko (its stub leaves it out).
            attr._flags &= ~attr.FLAG_PERMISSIONS  # type: ignore[attr-defined]
            paramiko.SFTPServer.set_file_attr(real, attr)
        if flags & os.O_WRONLY:
            fmode = "ab" if flags & os.O_APPEND else "wb"
        elif flags & os.O_RDWR:
            fmode = "a+b" if flags & os.O_APPEND else "r+b"
        else:
            fmode = "rb"
        try:
            fobj = os.fdopen(fd, fmode)
        except OSError as exc:
            os.close(fd)
            return _errno(exc)
        handle = _MeteredHandle(flags, self.meter)
        handle.filename = real
        handle.readfile = fobj
        handle.writefile = fobj
        return handle

    def _call(self, fn: Callable[..., Any], *paths: str) -> int:
        try:
            fn(*(self._real(p) for p in paths))
        except OSError as exc:
            return _errno(exc)
        return SFTP_OK

    def remove(self, path: str) -> int:
        return self._call(os.remove, path)

    def rename(self, oldpath: str, newpath: str) -> int:
        return self._call(os.rename, oldpath, newpath)

    def posix_rename(self, oldpath: str, newpath: str) -> int:
        return self._call(os.replace, oldpath, newpath)

    def mkdir(self, path: str, attr: paramiko.SFTPAttributes) -> int:
        return self._call(lambda p: os.mkdir(p, getattr(attr, "st_mode", None) or 0o755), path)

    def rmdir(self, path: str) -> int:
        return self._call(os.rmdir, path)

    def chattr(self, path: str, attr: paramiko.SFTPAttributes) -> int:
        try:
            paramiko.SFTPServer.set_file_attr(self._real(path), attr)
        except OSError as exc:
            return _errno(exc)
        return SFTP_OK

    def symlink(self, target_path: str, path: str) -> int:
        try:
            os.symlink(target_path, self._real(path))
        except OSError as exc:
            return _errno(exc)
        return SFTP_OK

    def readlink(self, path: str) -> str | int:
        try:
            return os.readlink(self._real(path))
        except OSError as exc:
            return _errno(exc)
