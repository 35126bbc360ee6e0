"""What the AsyncCollector and its workers share: messages and the shared-memory layout.

Torch-free: a worker imports this before it imports torch (with CUDA hidden).

Messages reuse the framing of :mod:`rlstash.envs.protocol` (one tag byte, a length, a
payload) but, unlike the env pool's strict request/reply, a worker runs ahead: several
``CHUNK`` replies (and the pool's ``FREE`` commands) may be in a pipe at once, so they are
read with :class:`Inbox`, which keeps the bytes of the next message.

Commands (collector -> worker): ``INIT`` (factories, sizes), ``ATTACH`` (layout, free slots,
reset seeds, bridge lanes), ``FREE`` (slot index: the collector copied that chunk out),
``INFO``, ``CLOSE``. Replies: ``OK`` (payload optional), ``CHUNK`` (slot index: that chunk is
complete), ``ERROR`` (the traceback; the worker exits after it).

Layout (one anonymous segment, every array 64-byte aligned, W workers, K slots per worker,
T steps per chunk, n envs per worker)::

    obs        [W, K, T, n, *obs_shape]   the observation each action was taken from
    action     [W, K, T, n, *act_shape]
    reward     [W, K, T, n] float32
    terminated [W, K, T, n] bool
    truncated  [W, K, T, n] bool
    final_obs  [W, K, T, n, *obs_shape]   same-step autoreset only
    next_obs   [W, K, n, *obs_shape]      the observation after the chunk's last step
    meta       [W, K, 3] int64            policy version, chunk number, incarnation
    weights/header [4] int64              seqlock counter, version, extras length
    weights/extras [EXTRAS_BYTES] uint8   pickle of the non-tensor leaves of the state dict
    weights/<i>    [nbytes_i] uint8       tensor leaf i of the policy's state dict, raw bytes
"""

from __future__ import annotations

import os
import select
import struct
import time
from collections import deque

import numpy as np
from gymnasium import spaces

from rlstash.envs import protocol as P
from rlstash.envs.shm import ALIGN, FieldSlot, Layout, space_leaves

INIT, ATTACH, FREE, INFO = (bytes([c]) for c in b"IAFN")
CLOSE = P.CLOSE  # the env pool's stop routine (CLOSE, wait, SIGKILL) stops these workers too
OK, CHUNK, ERROR = b"k", b"c", b"e"
SLOT = struct.Struct("<q")
EXTRAS_BYTES = 1 << 16
HEADER_SEQ, HEADER_VERSION, HEADER_EXTRAS = 0, 1, 2
STEP_FIELDS = ("obs", "action", "reward", "terminated", "truncated")


class Inbox:
    """Framed messages from one pipe; bytes of a following message are kept, not dropped."""

    def __init__(self, fd: int) -> None:
        self.fd = fd
        self.eof = False
        self._buf = bytearray()
        self._messages: deque[tuple[bytes, bytes]] = deque()

    def fill(self) -> None:
        """One ``os.read`` (blocks if nothing is there); sets :attr:`eof` at end of file."""
        try:
            chunk = os.read(self.fd, 1 << 16)
        except (ConnectionResetError, OSError):
            chunk = b""
        if not chunk:
            self.eof = True
            return
        self._buf += chunk
        size = P.HEADER.size
        while len(self._buf) >= size:
            tag, length = P.HEADER.unpack_from(self._buf)
            if len(self._buf) < size + length:
                break
            self._messages.append((tag, bytes(self._buf[size : size + length])))
            del self._buf[: size + length]

    @property
    def pending(self) -> bool:
        """Complete messages were read and not taken yet."""
        return bool(self._messages)

    def take(self) -> list[tuple[bytes, bytes]]:
        """Every complete message read so far, oldest first."""
        out = list(self._messages)
        self._messages.clear()
        return out

    def drain(self) -> list[tuple[bytes, bytes]]:
        """Every message available now, without blocking (check :attr:`eof` afterwards)."""
        while not self.eof and self.readable(0, ignore_pending=True):
            self.fill()
        return self.take()

    def readable(self, timeout: float | None, ignore_pending: bool = False) -> bool:
        """Wait up to ``timeout`` s (None: forever) until :meth:`fill` will not block."""
        if (self._messages and not ignore_pending) or self.eof:
            return True
        poller = select.poll()
        poller.register(self.fd, select.POLLIN)
        ms = -1 if timeout is None else max(0, int(timeout * 1000))
        return bool(poller.poll(ms))

    def next(self, deadline: float | None = None) -> tuple[bytes, bytes]:
        """The next message; ``deadline`` is a ``time.monotonic()`` value.

        Raises:
            P.PeerGone: end of file before a whole message.
            P.ReplyTimeout: the deadline passed first.
        """
        while not self._messages:
            if self.eof:
                raise P.PeerGone(f"pipe {self.fd}: writer is gone")
            left = None if deadline is None else deadline - time.monotonic()
            if left is not None and left <= 0 or not self.readable(left):
                raise P.ReplyTimeout(f"pipe {self.fd}: no message before the deadline")
            self.fill()
        return self._messages.popleft()


def flat_leaf(space: spaces.Space, what: str) -> tuple[tuple[int, ...], np.dtype]:
    """Shape and dtype of a space with a single array (Box, Discrete, MultiDiscrete,
    MultiBinary); TypeError for Dict/Tuple spaces (not supported by the AsyncCollector)."""
    leaves = space_leaves(space)
    if len(leaves) != 1 or leaves[0].path:
        raise TypeError(
            f"{what}: AsyncCollector supports Box, Discrete, MultiDiscrete and MultiBinary "
            f"spaces, got {space}; flatten Dict/Tuple spaces with a wrapper"
        )
    return leaves[0].shape, leaves[0].dtype


def build_layout(
    obs_space: spaces.Space,
    act_space: spaces.Space,
    workers: int,
    slots: int,
    steps: int,
    envs_per_worker: int,
    same_step: bool,
    weight_bytes: list[int],
) -> Layout:
    """The layout of the module docstring; ``weight_bytes``: bytes of each tensor leaf."""
    obs_shape, obs_dtype = flat_leaf(obs_space, "observation_space")
    act_shape, act_dtype = flat_leaf(act_space, "action_space")
    head = (workers, slots, steps, envs_per_worker)
    wanted: list[tuple[str, tuple[int, ...], np.dtype]] = [
        ("obs", (*head, *obs_shape), obs_dtype),
        ("action", (*head, *act_shape), act_dtype),
        ("reward", head, np.dtype(np.float32)),
        ("terminated", head, np.dtype(np.bool_)),
        ("truncated", head, np.dtype(np.bool_)),
    ]
    if same_step:
        wanted.append(("final_obs", (*head, *obs_shape), obs_dtype))
    wanted += [
        ("next_obs", (workers, slots, envs_per_worker, *obs_shape), obs_dtype),
        ("meta", (workers, slots, 3), np.dtype(np.int64)),
        ("weights/header", (4,), np.dtype(np.int64)),
        ("weights/extras", (EXTRAS_BYTES,), np.dtype(np.uint8)),
    ]
    wanted += [(f"weights/{i}", (n,), np.dtype(np.uint8)) for i, n in enumerate(weight_bytes)]
    fields, offset = [], 0
    for name, shape, dtype in wanted:
        slot = FieldSlot(name, tuple(int(d) for d in shape), dtype.str, offset)
        fields.append(slot)
        offset += -(-max(slot.nbytes, 1) // ALIGN) * ALIGN
    return Layout(workers * envs_per_worker, tuple(fields), offset)
