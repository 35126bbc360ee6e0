import threading

import pytest

from rlstash.ratelimit import RateLimiter


def updates_after(limiter: RateLimiter, inserts: list[int]) -> list[int]:
    out = []
    for n in inserts:
        limiter.on_insert(n)
        k = 0
        while limiter.can_sample():
            limiter.on_sample()
            k += 1
        out.append(k)
    return out


@pytest.mark.parametrize(
    "min_size, spi, batch, inserts, expected",
    [
        # SB3 DQN CartPole: train_freq 256, gradient_steps 128, batch 64 -> 32 samples per insert
        (1000, 32.0, 64, [500, 500, 256, 256], [0, 1, 128, 128]),
        # one update per env step, batch 256 -> 256 samples per insert
        (100, 256.0, 256, [99, 1, 1, 1, 4], [0, 1, 1, 1, 4]),
        # one update every 4 steps with batch 32 (Atari DQN): 8 samples per insert
        (8, 8.0, 32, [8, 4, 4, 4, 4], [1, 1, 1, 1, 1]),
    ],
)
def test_sync_schedule(min_size, spi, batch, inserts, expected):
    assert updates_after(RateLimiter(min_size, spi, batch), inserts) == expected


def test_long_run_ratio_holds():
    lim = RateLimiter(1000, 32.0, 64)
    updates_after(lim, [1000] + [256] * 200)
    ratio = lim.sampled / (lim.inserted - lim.min_size)
    assert abs(ratio - 32.0) < 0.5


def test_insert_blocks_when_learner_lags():
    lim = RateLimiter(10, 1.0, 4, tolerance=8)
    lim.on_insert(10)
    assert lim.can_insert(8) and not lim.can_insert(9)
    assert not lim.wait_insert(9, timeout=0.05)
    done = []
    t = threading.Thread(target=lambda: done.append(lim.wait_insert(9, timeout=5)))
    t.start()
    lim.on_sample(4)
    t.join(5)
    assert done == [True]


@pytest.mark.parametrize(
    "kwargs, match",
    [
        (dict(min_size=0, samples_per_insert=1.0, batch_size=1), "min_size"),
        (dict(min_size=10, samples_per_insert=0.0, batch_size=1), "samples_per_insert"),
        (dict(min_size=10, samples_per_insert=1.0, batch_size=0), "batch_size"),
        (dict(min_size=10, samples_per_insert=1.0, batch_size=64, tolerance=10), "deadlock"),
        (
            dict(min_size=10, samples_per_insert=8.0, batch_size=4, tolerance=10, insert_chunk=4),
            "deadlock",
        ),
        (dict(min_size=1000, samples_per_insert=1.0, batch_size=4, capacity=100), "capacity"),
    ],
)
def test_refuses_settings_that_deadlock(kwargs, match):
    with pytest.raises(ValueError, match=match):
        RateLimiter(**kwargs)


def test_state_roundtrip():
    a = RateLimiter(10, 2.0, 4)
    updates_after(a, [10, 5])
    b = RateLimiter(10, 2.0, 4)
    b.load_state_dict(a.state_dict())
    assert (b.inserted, b.sampled) == (a.inserted, a.sampled)
