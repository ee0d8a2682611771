"""The paramiko server plumbing both of the simulator's SSH servers share (a host's `sshhost`, the machine's copy
daemon `copyd`): a loopback listener, its accept loop, a connection's server transport and handshake, a process's
pipes relayed over a channel, and a connection cut with RST."""

from __future__ import annotations

import contextlib
import logging
import os
import socket
import struct
import threading
from collections.abc import Callable
from typing import IO, Any

import paramiko
from paramiko.common import MSG_CHANNEL_REQUEST

ACCEPT_POLL_S = 0.2
READ_CHUNK = 65536
# Server-side transports log under their own name, silenced: a client hanging up is routine here and
# must not print "Socket exception" into the harness's terminal.
LOG_CHANNEL = "vast_harness.sim.ssh"
logging.getLogger(LOG_CHANNEL).addHandler(logging.NullHandler())
logging.getLogger(LOG_CHANNEL).propagate = False


def listen_loopback() -> socket.socket:
    """A listening socket on 127.0.0.1 at a free port, its accept polled so that a close is seen."""
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind(("127.0.0.1", 0))
    sock.listen(16)
    sock.settimeout(ACCEPT_POLL_S)
    return sock


def start_accepting(listener: socket.socket, closed: threading.Event, serve: Callable[[socket.socket], None], *,
                    name: str, admit: Callable[[], bool] | None = None) -> None:
    """Accept on `listener` in a daemon thread until `closed` is set or the listener is closed; each connection
    `admit` refuses is reset, each other one is served in its own daemon thread."""
    def loop() -> None:
        while not closed.is_set():
            try:
                conn, _ = listener.accept()
            except TimeoutError:
                continue
            except OSError:
                return  # listener closed
            if admit is not None and not admit():
                reset(conn)
                continue
            threading.Thread(target=serve, args=(conn,), daemon=True).start()

    threading.Thread(target=loop, daemon=True, name=name).start()


def server_transport(conn: socket.socket, host_key: paramiko.PKey) -> paramiko.Transport:
    """A server-side transport over an accepted connection, with the host's key, logging silenced, whose channel
    requests run what `after_answer` queued once their reply has gone out."""
    conn.settimeout(None)
    transport = paramiko.Transport(conn)
    transport.set_log_channel(LOG_CHANNEL)
    transport.add_server_key(host_key)
    # paramiko sends a request's reply after the server's check returns; a command started from the check can
    # exit, and close its channel, first, and the client then sees "Channel closed" instead of the command's
    # outcome. sshd replies before it reads the child's output; so does this transport (its own table).
    transport._channel_handler_table = {  # type: ignore[attr-defined]
        **paramiko.Transport._channel_handler_table,  # type: ignore[attr-defined]
        MSG_CHANNEL_REQUEST: _answer_then_start,
    }
    return transport


_AFTER_ANSWER = "_sim_after_answer"


def after_answer(channel: paramiko.Channel, start: Callable[[], None]) -> None:
    """Run `start` (on the transport's thread, so briefly) once the request being checked has been answered."""
    setattr(channel, _AFTER_ANSWER, start)


def _answer_then_start(channel: paramiko.Channel, m: paramiko.Message) -> None:
    paramiko.Channel._handle_request(channel, m)  # type: ignore[attr-defined]  # checks, then replies
    start = channel.__dict__.pop(_AFTER_ANSWER, None)
    if start is not None:
        start()


def handshake(transport: paramiko.Transport, conn: socket.socket, server: paramiko.ServerInterface) -> None:
    """The SSH handshake; auth and channels then go on on the transport's thread, asking `server`. A client that
    fails the negotiation is cut."""
    try:
        transport.start_server(server=server)
    except (paramiko.SSHException, OSError, EOFError):
        transport.close()
        reset(conn)


def pump(stream: IO[bytes], send: Callable[[bytes], Any]) -> None:
    """Forward a pipe as bytes arrive; when the channel is gone, close the pipe (the writer gets EPIPE)."""
    fd = stream.fileno()
    try:
        while chunk := os.read(fd, READ_CHUNK):
            send(chunk)
    except (OSError, EOFError, paramiko.SSHException):
        pass
    finally:
        stream.close()


def feed_stdin(channel: paramiko.Channel, stdin: IO[bytes]) -> None:
    try:
        while data := channel.recv(READ_CHUNK):
            stdin.write(data)
            stdin.flush()
    except (OSError, EOFError, paramiko.SSHException):
        pass
    finally:
        with contextlib.suppress(OSError):
            stdin.close()


def reset(conn: socket.socket) -> None:
    """Close with RST, so the client sees a refused/reset connection rather than a hang."""
    with contextlib.suppress(OSError):
        conn.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    conn.close()
