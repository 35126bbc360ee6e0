"""Messages between the pool and its workers: one tag byte, a length, a payload (torch-free).

Each worker has two pipes: commands (pool -> worker) and replies (worker -> pool). The
protocol is strictly request/reply, so at most one message is in flight per pipe and a reply
of a step is usually a single 5-byte write. Payloads are pickles; data never travels here
(it is in shared memory).

Commands (closed set): INIT, ATTACH, RESET, STEP, CALL, SETATTR, INFO, CLOSE.
Replies: OK (payload optional) or ERROR (payload: dict with type, message, traceback).
"""

from __future__ import annotations

import os
import select
import struct
import time

INIT, ATTACH, RESET, STEP, CALL, SETATTR, INFO, CLOSE = (bytes([c]) for c in b"IARSCTNQ")
OK, ERROR = b"k", b"e"
COMMANDS = {INIT, ATTACH, RESET, STEP, CALL, SETATTR, INFO, CLOSE}

HEADER = struct.Struct("<cI")
STEP_MESSAGE = HEADER.pack(STEP, 0)
OK_MESSAGE = HEADER.pack(OK, 0)
_CHUNK = 1 << 16


class PeerGone(ConnectionError):
    """The other end closed its pipe (the process ended)."""


class ReplyTimeout(TimeoutError):
    """No complete message arrived before the deadline."""


def send(fd: int, tag: bytes, payload: bytes = b"") -> None:
    """Write one message; raises :class:`PeerGone` if the reader is gone."""
    data = memoryview(HEADER.pack(tag, len(payload)) + payload)
    try:
        while data:
            data = data[os.write(fd, data) :]
    except (BrokenPipeError, ConnectionResetError) as exc:
        raise PeerGone(f"pipe {fd}: reader is gone") from exc


def _wait_readable(fd: int, deadline: float | None) -> None:
    if deadline is None:
        return
    poller = select.poll()  # poll, not select: descriptors may exceed FD_SETSIZE
    poller.register(fd, select.POLLIN)
    while True:
        remaining = deadline - time.monotonic()
        if poller.poll(max(0, int(remaining * 1000) + 1)):
            return
        if deadline - time.monotonic() <= 0:
            raise ReplyTimeout(f"pipe {fd}: no message before the deadline")


def _read(fd: int, n: int, deadline: float | None) -> bytes:
    _wait_readable(fd, deadline)
    try:
        chunk = os.read(fd, n)
    except ConnectionResetError as exc:
        raise PeerGone(f"pipe {fd}: writer is gone") from exc
    if not chunk:
        raise PeerGone(f"pipe {fd}: writer is gone")
    return chunk


def _read_exact(fd: int, n: int, deadline: float | None) -> bytes:
    """Exactly ``n`` bytes: never more, so the next message stays in the pipe."""
    data = _read(fd, n, deadline)
    if len(data) == n:
        return data
    parts = [data]
    got = len(data)
    while got < n:
        chunk = _read(fd, min(_CHUNK, n - got), deadline)
        parts.append(chunk)
        got += len(chunk)
    return b"".join(parts)


class Spinner:
    """A bounded spin before a blocking read, kept only while it pays.

    Waking a sleeping process costs tens of microseconds, and on a busy core the woken
    worker can take the core of the process that woke it. When the next message usually
    comes within ``seconds``, polling the pipe that long without sleeping avoids both. After a
    wait longer than ``seconds`` (a slow caller: a policy, a training step) the next wait
    blocks at once; it spins again once waits are short again. ``seconds=0``: never spins.
    """

    def __init__(self, fd: int, seconds: float) -> None:
        self.seconds = seconds
        self.short = True  # the last wait was within the budget
        self._poller = select.poll()
        self._poller.register(fd, select.POLLIN)
        self._since = 0.0

    def wait(self) -> None:
        """Spin until ``fd`` is readable or the budget is spent (if the last wait was short);
        call right before the blocking read, then :meth:`done` after it."""
        self._since = now = time.perf_counter()
        if not (self.seconds and self.short):
            return
        end, poll = now + self.seconds, self._poller.poll
        while not poll(0) and time.perf_counter() < end:
            pass

    def done(self) -> None:
        """The message was read: remember whether the wait was short."""
        self.short = time.perf_counter() - self._since <= self.seconds


def recv(fd: int, deadline: float | None = None) -> tuple[bytes, bytes]:
    """Read one message ``(tag, payload)``; ``deadline`` is a ``time.monotonic()`` value.

    Reads the header, then exactly the payload: a message queued behind this one (CLOSE
    written while the worker had not yet read a STEP) stays in the pipe for the next call.

    Raises:
        PeerGone: end of file (the writer exited or closed its end).
        ReplyTimeout: the deadline passed before a whole message came.
    """
    tag, length = HEADER.unpack(_read_exact(fd, HEADER.size, deadline))
    return tag, _read_exact(fd, length, deadline) if length else b""
