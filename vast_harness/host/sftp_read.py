"""A whole file read over SFTP at prefetch speed, each block asked for once.

paramiko's `getfo` prefetches: a thread sends every read request while the caller reads the answers. paramiko
takes "no request waiting for its answer" to mean "prefetch done", and on a busy machine the caller can take
every answer before the thread sends the next request (paramiko PR #2519, open). From then on each block is
asked for a second time, one round trip each: the host sends, and bills, the rest of the file twice, and the
unread first copies stay in memory until the file closes (a checkpoint of many GB would fill this machine's).
Here the prefetch is done only when its last request has been sent and answered.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import IO, Any

import paramiko
from paramiko.sftp import CMD_READ, int64

_READ_BYTES = 32768  # what getfo reads at a time (paramiko's request size)


class _PrefetchFile(paramiko.SFTPFile):
    """paramiko's SFTPFile, its prefetch ending only once every block has been asked for and answered."""

    _all_requested = False

    def _prefetch_thread(self, chunks: list[tuple[int, int]], max_concurrent_requests: int | None) -> None:
        # paramiko's request loop (no limit on requests in flight, as getfo asks), recording the last request
        # under the lock that the answers are matched under.
        with self._prefetch_lock:  # type: ignore[attr-defined]
            if not chunks:
                self._all_requested = self._prefetch_done = True
        for index, (offset, length) in enumerate(chunks):
            num = self.sftp._async_request(  # type: ignore[attr-defined]
                self, CMD_READ, self.handle, int64(offset), int(length))
            with self._prefetch_lock:  # type: ignore[attr-defined]
                self._prefetch_extents[num] = (offset, length)  # type: ignore[attr-defined]
                self._all_requested = index == len(chunks) - 1

    def _async_response(self, t: int, msg: paramiko.Message, num: int) -> None:
        super()._async_response(t, msg, num)  # type: ignore[misc]
        with self._prefetch_lock:  # type: ignore[attr-defined]
            if not self._all_requested:
                self._prefetch_done = False  # every answer taken, but requests are still to be sent


def read_whole(sftp: paramiko.SFTPClient, remote: str, sink: IO[bytes],
               callback: Callable[[int, int], Any] | None = None) -> int:
    """Copy the remote file into `sink` as getfo does (prefetch, `callback(done, total)` after each block);
    returns the bytes copied."""
    file_size = sftp.stat(remote).st_size or 0
    with sftp.open(remote, "rb") as source:
        source.__class__ = _PrefetchFile  # the file as paramiko opened it, its prefetch mended
        source.prefetch(file_size)
        done = 0
        while data := source.read(_READ_BYTES):
            sink.write(data)
            done += len(data)
            if callback is not None:
                callback(done, file_size)
    return done
