"""The replay buffer's prefetch thread: batches sampled ahead, handed over safely.

A :class:`Prefetcher` runs ``buffer._sample_now(batch_size)`` on a daemon thread and keeps
up to ``depth`` results in a queue. It holds only a weak reference to the buffer, so a buffer
dropped without ``close()`` still stops its thread. See :class:`Prefetcher` for errors and
for how CUDA batches cross threads (invariant I4).
"""

from __future__ import annotations

import queue
import threading
import weakref
from typing import Any

from rlstash.device import Handover
from rlstash.spec import Batch

__all__ = ["Prefetcher", "Stopped"]


class Stopped(Exception):
    """The prefetcher a caller waited on was stopped (the buffer closed, or a new batch size)."""


class _Failure:
    """A sample that failed in the prefetch thread: raised to the caller that takes it."""

    __slots__ = ("error",)

    def __init__(self, error: BaseException) -> None:
        self.error = error


class Prefetcher:
    """A daemon thread that keeps ``depth`` batches ready; holds only a weak reference.

    A failed sample (an empty buffer, a transform that raises) is queued behind the batches
    made before it and raised to the caller that takes it; the thread then ends, and the next
    ``sample`` starts a fresh prefetcher, so an error is never handed to a later caller after
    the cause may be gone (the buffer extended since). CUDA batches cross threads through a
    :class:`~rlstash.device.Handover`: an event recorded on the thread's stream, waited on by
    the caller's current stream, and ``record_stream`` for the caller (invariant I4).
    """

    def __init__(self, buffer: Any, batch_size: int, depth: int) -> None:
        self.batch_size = batch_size
        self.queue: queue.Queue[Any] = queue.Queue(maxsize=depth)
        self.stop_event = threading.Event()
        self.handover = Handover(buffer.delivery.ops)
        ref = weakref.ref(buffer)
        self.thread = threading.Thread(
            target=_prefetch_loop,
            args=(ref, batch_size, self.queue, self.stop_event, self.handover),
            name="rlstash-prefetch",
            daemon=True,
        )
        self.thread.start()

    @property
    def spent(self) -> bool:
        """True once the thread ended (after a failure) and every queued item was taken."""
        return not self.thread.is_alive() and self.queue.empty()

    def get(self) -> Batch:
        """The next batch, made safe for the caller's stream. Raises :class:`Stopped` when
        stopped or spent (the caller then asks the buffer again)."""
        while True:
            if self.stop_event.is_set():
                raise Stopped
            try:
                item = self.queue.get(timeout=0.05)
            except queue.Empty:
                if not self.thread.is_alive() and self.queue.empty():
                    raise Stopped from None
                continue
            if type(item) is _Failure:
                raise item.error
            batch, marks = item
            return self.handover.receive(batch, marks) if marks else batch

    def stop(self) -> None:
        self.stop_event.set()
        _drain(self.queue)  # unblock a put() waiting on a full queue
        self.thread.join(timeout=10.0)
        _drain(self.queue)


def _drain(q: queue.Queue) -> None:
    while True:
        try:
            q.get_nowait()
        except queue.Empty:
            return


def _prefetch_loop(
    ref: weakref.ref, batch_size: int, q: queue.Queue, stop: threading.Event, handover: Handover
) -> None:
    failed = False
    while not (stop.is_set() or failed):
        buffer = ref()
        if buffer is None:
            return
        try:
            batch = buffer._sample_now(batch_size)
            item: Any = (batch, handover.mark(batch))  # event behind the batch's GPU work
        except BaseException as exc:  # noqa: BLE001 - raised to the caller by get()
            item, failed = _Failure(exc), True
        del buffer
        while not stop.is_set():
            try:
                q.put(item, timeout=0.1)
                break
            except queue.Full:
                if ref() is None:
                    return
        del item
