"""ReplayBuffer: bad input gets a clear error (I8); prefetch survives errors; close() under
concurrent sampling leaves no thread (I6)."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap

import pytest

from rlstash.replay import ReplayBuffer
from rlstash.storage import TensorStorage
from tests.test_replay import SPEC, make, rows


def test_transform_returning_a_non_tensor_names_the_key_and_the_transform():
    def add_loss(b):
        return {**b, "loss": 0.5}

    rb = make(transforms=[add_loss])
    rb.extend(rows(0, 4))
    with pytest.raises(
        TypeError, match=r"transform .*add_loss.*float for key 'loss'.*torch\.Tensor"
    ):
        rb.sample(2)


def test_huge_batch_size_is_a_clear_error_not_an_oom():
    rb = make(capacity=16)
    rb.extend(rows(0, 4))
    with pytest.raises(ValueError, match=r"batch_size: 1,000,000,000,000 rows .*capacity 16.*RAM"):
        rb.sample(10**12)
    # above the capacity but small: rows repeat, which is allowed
    assert rb.sample(40)["index"].shape == (40,)


@pytest.mark.parametrize("bad", [True, 2.0, "2"])
def test_prefetch_must_be_an_int_count(bad):
    with pytest.raises(TypeError, match=r"prefetch: expected an int count"):
        make(prefetch=bad)
    with pytest.raises(ValueError, match="prefetch"):
        make(prefetch=-1)


def test_prefetch_thread_survives_a_failed_sample():
    rb = make(prefetch=2)
    with pytest.raises(ValueError, match="empty"):
        rb.sample(2)  # the error goes to this caller ...
    rb.extend(rows(0, 8))
    for _ in range(5):  # ... and later samples work (the same thread)
        assert rb.sample(2)["obs"].shape == (2, 3)
    thread = rb._prefetcher.thread
    rb.close()
    assert not thread.is_alive()


def test_prefetch_error_of_a_transform_goes_once_to_its_caller():
    calls = {"n": 0}

    def flaky(b):
        calls["n"] += 1
        if calls["n"] == 1:
            raise KeyError("first call fails")
        return b

    rb = make(prefetch=3, transforms=[flaky])
    rb.extend(rows(0, 8))
    with pytest.raises(KeyError, match="first call fails"):
        rb.sample(2)
    for _ in range(4):
        assert rb.sample(2)["obs"].shape == (2, 3)
    rb.close()


def test_closed_buffer_refuses_sample_and_extend():
    for prefetch in (0, 2):
        rb = make(prefetch=prefetch)
        rb.extend(rows(0, 4))
        rb.close()
        with pytest.raises(RuntimeError, match="ReplayBuffer is closed"):
            rb.sample(2)
        with pytest.raises(RuntimeError, match="ReplayBuffer is closed"):
            rb.extend(rows(0, 2))
        rb.close()  # idempotent


_CLOSE_RACE = textwrap.dedent(
    """
    import json, threading, time
    import torch
    from rlstash.replay import ReplayBuffer
    from rlstash.storage import TensorStorage

    spec = {"obs": ((3,), torch.float32)}
    trials, bad = 40, []
    for trial in range(trials):
        prefetch = trial % 3  # 0, 1, 2
        rb = ReplayBuffer(TensorStorage(spec, 64), seed=trial, prefetch=prefetch)
        rb.extend({"obs": torch.zeros(32, 3)})
        started = threading.Barrier(5)

        def sampler(k):
            started.wait()
            try:
                while True:
                    rb.sample(4 + k % 2)  # two batch sizes: the prefetcher is replaced too
            except RuntimeError as exc:
                if "ReplayBuffer is closed" not in str(exc):
                    bad.append(repr(exc))
            except BaseException as exc:
                bad.append(repr(exc))

        threads = [threading.Thread(target=sampler, args=(k,)) for k in range(4)]
        for t in threads:
            t.start()
        started.wait()
        time.sleep(0.002 * (trial % 5))
        rb.close()
        for t in threads:
            t.join(10)
            if t.is_alive():
                bad.append("a sampling thread hangs after close()")
    time.sleep(0.2)
    left = [t.name for t in threading.enumerate() if t is not threading.main_thread()]
    print(json.dumps({"bad": bad, "left": left}))
    """
)


@pytest.mark.slow
def test_close_while_threads_sample_gives_closed_errors_and_leaves_no_thread():
    """40 trials of 4 threads sampling (prefetch 0, 1, 2) while the buffer is closed: each
    thread ends with "ReplayBuffer is closed", and no thread is left (run in a subprocess)."""
    proc = subprocess.run(
        [sys.executable, "-c", _CLOSE_RACE], capture_output=True, text=True, timeout=240
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    result = json.loads(proc.stdout.strip().splitlines()[-1])
    assert result["bad"] == [], result["bad"][:5]
    assert result["left"] == []


def test_buffer_dropped_without_close_stops_its_prefetch_thread():
    import gc
    import time

    rb = ReplayBuffer(TensorStorage(SPEC, 16), seed=0, prefetch=2)
    rb.extend(rows(0, 8))
    rb.sample(2)
    thread = rb._prefetcher.thread
    del rb
    gc.collect()
    thread.join(5)
    assert not thread.is_alive()
    time.sleep(0)
