"""Compressed frames (StreamStorage(backing=FrameCompression(...))) against the plain stream."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
import torch

from rlstash.storage.codecs import CODECS, make_codec
from rlstash.storage.frames import FrameArena, FrameCompression
from rlstash.storage.stream import ReadSpec, StreamStorage

H = W = 24


def pong_like(T: int, N: int, seed: int) -> np.ndarray:
    """Frames that look like an Atari screen: flat background, a border, two paddles and a
    ball that move, a score that changes now and then. uint8 [T, N, H, W]."""
    rng = np.random.default_rng(seed)
    f = np.full((T, N, H, W), 87, np.uint8)
    f[:, :, :2] = 236  # top border
    f[:, :, -2:] = 236
    t = np.arange(T)[:, None]
    for e in range(N):
        p0 = (np.cumsum(rng.integers(-1, 2, T)) % (H - 8)) + 2
        p1 = (np.cumsum(rng.integers(-1, 2, T)) % (H - 8)) + 2
        bx = (t[:, 0] * (1 + e) + 3) % (W - 4) + 2
        by = (t[:, 0] * 2 + e) % (H - 4) + 2
        for i in range(T):
            f[i, e, p0[i] : p0[i] + 4, 1:3] = 147
            f[i, e, p1[i] : p1[i] + 4, W - 3 : W - 1] = 92
            f[i, e, by[i] : by[i] + 1, bx[i] : bx[i] + 1] = 236
            f[i, e, 0, : (i // 37) % 6 + 1] = 50  # "score"
    return f


def random_frames(T: int, N: int, seed: int) -> np.ndarray:
    return np.random.default_rng(seed).integers(0, 256, (T, N, H, W), dtype=np.uint8)


def episodes(T: int, N: int, seed: int, mean: int = 12) -> tuple[np.ndarray, np.ndarray]:
    """terminated, truncated [T, N] of random episode ends (next-step autoreset)."""
    rng = np.random.default_rng(seed + 1)
    end = rng.random((T, N)) < 1.0 / mean
    trunc = end & (rng.random((T, N)) < 0.3)
    return end & ~trunc, trunc


def feed(stores, frames, term, trunc, chunk, stacked, same_step=False):
    T, N = term.shape
    k = stores[0].reads.frame_stack
    for t0 in range(0, T, chunk):
        t1 = min(T, t0 + chunk)
        obs = torch.from_numpy(frames[t0:t1])
        if stacked:  # the env's stacks: frames t-3..t (padding is not checked by the stream)
            idx = np.maximum(np.arange(t0, t1)[:, None] - np.arange(k - 1, -1, -1), 0)
            obs = torch.from_numpy(frames[idx].transpose(0, 2, 1, 3, 4).copy())
        batch = {
            "obs": obs,
            "action": torch.arange(t0 * N, t1 * N).reshape(t1 - t0, N),
            "reward": torch.rand(t1 - t0, N, generator=torch.Generator().manual_seed(t0)),
            "terminated": torch.from_numpy(term[t0:t1]),
            "truncated": torch.from_numpy(trunc[t0:t1]),
        }
        if same_step:  # the final obs of an ended episode: the frame 3 steps later, say
            batch["final_obs"] = torch.from_numpy(frames[np.minimum(np.arange(t0, t1) + 3, T - 1)])
        for s in stores:
            s.extend(batch)


def pair(comp, N=3, L=40, n_step=1, k=4, stacked=False, autoreset="next_step"):
    shape = (k, H, W) if stacked else (H, W)
    spec = {"obs": (shape, torch.uint8), "action": ((), torch.int64)}
    reads = ReadSpec(n_step=n_step, gamma=0.9, frame_stack=k)
    kw = dict(reads=reads, stacked_input=stacked, autoreset=autoreset)
    plain = StreamStorage(spec, N, N * L, **kw)
    packed = StreamStorage(spec, N, N * L, backing=comp, **kw)
    return plain, packed


def assert_same_reads(plain, packed, max_lost):
    """Every start the compressed stream holds reads as the plain one; it holds all of the
    plain one's slots but at most ``max_lost`` per lane (the oldest, whose key frame left),
    so all of its starts but those whose frames reach into them."""
    assert not (packed.valid & ~plain.valid).any()
    lost = packed.lanes.alive_floor() - plain.lanes.alive_floor()
    assert (lost >= 0).all() and (lost <= max_lost).all(), lost
    k = plain.reads.frame_stack
    lost_starts = (plain.valid & ~packed.valid).reshape(-1, plain.num_envs).sum(0)  # per lane
    assert (lost_starts <= max_lost + k - 1).all(), lost_starts
    idx = np.flatnonzero(packed.valid)
    assert idx.size > 0
    a, b = plain.read(idx), packed.read(idx)
    assert set(a) == set(b)
    for key in a:
        torch.testing.assert_close(b[key], a[key], rtol=0, atol=0, msg=key)
    g = packed.gather(idx)  # the sampler's hot path (shared obs/next_obs gather)
    for key in a:
        torch.testing.assert_close(g[key], a[key], rtol=0, atol=0, msg=key)


@pytest.mark.parametrize("codec", CODECS)
@pytest.mark.parametrize("delta", [False, True])
@pytest.mark.parametrize("kind", ["pong_like", "random", "mixed"])
def test_round_trip_equals_the_plain_stream_across_the_ring(codec, delta, kind):
    T, N = 150, 3  # L = 40 slots per lane: the ring wraps ~3.7 times
    frames = pong_like(T, N, seed=1) if kind != "random" else random_frames(T, N, seed=1)
    if kind == "mixed":  # runs of incompressible frames (stored raw) among compressible ones
        noisy = (np.arange(T) // 7 % 3 == 0)[:, None, None, None]
        frames = np.where(noisy, random_frames(T, N, seed=11), frames)
    term, trunc = episodes(T, N, seed=2)
    comp = FrameCompression(codec, delta=delta, key_every=5, budget=1.0)
    plain, packed = pair(comp, N)
    for chunk in (1, 7):
        feed([plain, packed], frames[: T // 2] if chunk == 1 else frames[T // 2 :],
             *(x[: T // 2] if chunk == 1 else x[T // 2 :] for x in (term, trunc)), chunk, False)  # fmt: skip
        assert_same_reads(plain, packed, max_lost=comp.chain - 1)
    arena = packed.backing.arenas["obs"]
    if kind == "random":  # a delta that does not compress is stored as a key frame instead
        assert arena.raw.all() and (arena.depth == 0).all()
    elif kind == "pong_like":
        assert not arena.raw.any() and (arena.depth.max() == comp.chain - 1)
    else:
        assert arena.raw.any() and not arena.raw.all()


@pytest.mark.parametrize("codec", CODECS)
@pytest.mark.parametrize("n_step,stacked", [(3, False), (1, True), (2, True)])
def test_nstep_and_env_stacks_round_trip_at_every_step(codec, n_step, stacked):
    T, N = 90, 2
    frames = pong_like(T, N, seed=3)
    term, trunc = episodes(T, N, seed=4, mean=9)
    comp = FrameCompression(codec, delta=True, key_every=3, budget=1.0)
    plain, packed = pair(comp, N, L=24, n_step=n_step, stacked=stacked)
    for t in range(0, T, 5):
        feed([plain, packed], frames[t : t + 5], term[t : t + 5], trunc[t : t + 5], 5, stacked)
        if packed.valid.any():
            assert_same_reads(plain, packed, max_lost=comp.chain - 1)


@pytest.mark.parametrize("delta", [False, True])
def test_a_small_budget_keeps_fewer_transitions_never_more_bytes(delta):
    """Incompressible frames in an arena planned for a quarter of each: the oldest go first,
    each lane keeps at least budget * L frames, and what is kept still reads right."""
    T, N, L = 120, 2, 40
    frames = random_frames(T, N, seed=5)
    term, trunc = episodes(T, N, seed=6)
    comp = FrameCompression("lz4", delta=delta, key_every=4, budget=0.25)
    plain, packed = pair(comp, N, L=L)
    planned = StreamStorage.plan_bytes(
        {"obs": ((H, W), torch.uint8), "action": ((), torch.int64)}, N * L, 4, False, N, comp
    )
    assert packed.nbytes == sum(planned.values())  # exact, known before allocation (I2)
    for t in range(0, T, 3):
        feed([plain, packed], frames[t : t + 3], term[t : t + 3], trunc[t : t + 3], 3, False)
        arena = packed.backing.arenas["obs"]
        held = arena.count - arena.floor
        assert (held >= min(t + 3, int(0.25 * L) - (comp.chain - 1))).all() and (
            held < L // 2
        ).all()
        assert (packed.lanes.alive_floor() >= arena.floor).all()
        if packed.valid.any():
            assert_same_reads(plain, packed, max_lost=L)
    assert arena.stored_bytes() <= arena.A * N


def test_every_frame_is_decodable_after_its_reference_slot_is_reused():
    """Delta chains never outlive their key: after many wraps, each frame the arena holds
    decodes to what was written (checked directly on the arena, all lanes, every slot)."""
    N, L, F = 2, 10, (6, 5)
    comp = FrameCompression("zstd", delta=True, key_every=4, budget=0.6)
    arena = FrameArena(F, N, L, comp)
    rng = np.random.default_rng(7)
    written = {}
    for c in range(57):
        fr = np.where(rng.random((N, 30)) < 0.8, 9, rng.integers(0, 256, (N, 30))).astype(np.uint8)
        rows = (c % L) * N + np.arange(N)  # the stream's slot-major rows
        arena.write(rows, fr)
        for e in range(N):
            written[(e, c)] = fr[e]
        for e in range(N):
            for s in range(int(arena.floor[e]), c + 1):
                got = arena.gather(np.array([(s % L) * N + e]))
                np.testing.assert_array_equal(got.reshape(-1), written[(e, s)])
    assert (arena.count - arena.floor >= 1).all()


def test_bad_codec_and_settings_name_the_option_and_the_choices():
    with pytest.raises(
        ValueError, match=r"FrameCompression.codec: expected one of \['lz4', 'zstd'\], got 'snappy'"
    ):
        FrameCompression("snappy")
    with pytest.raises(ValueError, match="FrameCompression.budget"):
        FrameCompression(budget=0.0)
    with pytest.raises(ValueError, match="FrameCompression.key_every"):
        FrameCompression(key_every=0)
    with pytest.raises(ValueError, match=r"FrameCompression.level: zstd takes an int in \[1, 22\]"):
        FrameCompression("zstd", level=40)
    with pytest.raises(ValueError, match=r"codec: expected one of \['lz4', 'zstd'\]"):
        make_codec("gzip")
    spec = {"obs": ((4,), torch.float32), "action": ((), torch.int64)}
    with pytest.raises(ValueError, match="uint8 pixel obs fields"):
        StreamStorage(spec, 1, 10, backing=FrameCompression())
    spec = {"obs": ((H, W), torch.uint8), "action": ((), torch.int64)}
    with pytest.raises(ValueError, match="host RAM"):
        StreamStorage(spec, 1, 10, backing=FrameCompression(), path="somewhere")


def test_a_missing_codec_package_says_how_to_install_it(monkeypatch):
    import sys

    monkeypatch.setitem(sys.modules, "lz4.block", None)
    monkeypatch.setitem(sys.modules, "zstandard", None)
    for name in CODECS:
        with pytest.raises(ImportError, match=r"pip install 'rlstash\[compress\]'"):
            make_codec(name)


def test_state_dict_round_trip_and_replay_buffer_sampling():
    from rlstash.replay import ReplayBuffer

    T, N = 70, 2
    frames = pong_like(T, N, seed=8)
    term, trunc = episodes(T, N, seed=9)
    comp = FrameCompression("lz4", delta=True, key_every=4, budget=0.5)
    plain, packed = pair(comp, N, L=30)
    feed([plain, packed], frames, term, trunc, 10, False)
    state = packed.state_dict()
    again = StreamStorage.from_state_dict(state)
    assert again.compression == comp
    np.testing.assert_array_equal(again.valid, packed.valid)
    assert_same_reads(plain, again, max_lost=comp.chain - 1)
    rb = ReplayBuffer(again, seed=0)
    got = rb.sample(16)
    idx = got["index"].numpy() if "index" in got else None
    assert got["obs"].shape == (16, 4, H, W) and got["next_obs"].shape == (16, 4, H, W)
    if idx is not None:
        want = plain.read(idx)
        torch.testing.assert_close(got["obs"], want["obs"], rtol=0, atol=0)
    again.extend(  # it goes on writing after a load
        {
            "obs": torch.from_numpy(frames[:1]),
            "action": torch.zeros(1, N, dtype=torch.int64),
            "reward": torch.zeros(1, N),
            "terminated": torch.zeros(1, N, dtype=torch.bool),
            "truncated": torch.zeros(1, N, dtype=torch.bool),
        }
    )
    with pytest.raises(ValueError, match="other settings"):
        other = StreamStorage(
            {"obs": ((H, W), torch.uint8), "action": ((), torch.int64)}, N, N * 30,
            backing=FrameCompression("zstd"), reads=ReadSpec(1, 0.9, 4),
        )  # fmt: skip
        other.load_state_dict(state)


def test_cli_plan_with_compression_equals_what_the_stream_allocates(capsys):
    from rlstash import cli

    argv = ["plan", "--field", "obs=4x16x16:uint8", "--field", "action=:int64", "--buffer-size"]
    argv += ["999", "--num-envs", "4", "--frame-stack", "4", "--layout", "stream"]
    argv += ["--compress", "zstd", "--compress-budget", "0.2"]
    p, note = cli.build_plan(cli.build_parser().parse_args(argv))
    spec = {"obs": ((4, 16, 16), torch.uint8), "action": ((), torch.int64)}
    comp = FrameCompression("zstd", budget=0.2)
    store = StreamStorage(spec, 4, 999, comp, reads=ReadSpec(frame_stack=4), stacked_input=True)
    arena = store.backing.arenas["obs"]
    allocated = sum(a.nbytes for a in arena.arrays().values())
    allocated += sum(t.untyped_storage().nbytes() for t in store.backing.tensors.values())
    allocated += sum(getattr(store.lanes, k).nbytes for k in ("flags", "ep", "valid", "ids"))
    allocated += sum(getattr(store.lanes, k).nbytes for k in ("count", "floor", "next_ep"))
    allocated += store.lanes.reserved.nbytes + store.lanes.pending.nbytes + store._cut.nbytes
    assert p.place("ram").needed == p.total == allocated == store.nbytes
    assert arena.A == (int(np.ceil(0.2 * 249)) + 1) * 256  # (budget * L + 1) * F per lane
    assert "zstd (per frame), budget 0.2" in note and "at least 49 per lane" in note
    assert cli.main(argv) == 0
    out = capsys.readouterr().out
    assert "frames: obs (zstd arena)" in out and f"{allocated:,}" in out
    for bad, flag in ((["--compress", "brotli"], "--compress"), (["--compress-budget", "3"], "--compress-budget")):  # fmt: skip
        argv2 = argv[:-4] + (bad if bad[0] == "--compress" else ["--compress", "lz4", *bad])
        assert cli.main(argv2) == 2
        err = capsys.readouterr().err.strip()
        assert err.count("\n") == 0 and flag + ":" in err and "expected" in err


def test_replay_buffer_save_and_load_keep_the_compressed_frames(tmp_path):
    from rlstash.replay import ReplayBuffer

    T, N = 60, 2
    frames = pong_like(T, N, seed=12)
    term, trunc = episodes(T, N, seed=13)
    comp = FrameCompression("zstd", delta=True, key_every=4, budget=0.3)
    plain, packed = pair(comp, N, L=25)
    feed([plain, packed], frames, term, trunc, 6, False)
    rb = ReplayBuffer(packed, seed=0)
    rb.save(tmp_path / "rb.pt")
    loaded = ReplayBuffer.load(tmp_path / "rb.pt")
    assert isinstance(loaded.storage, StreamStorage) and loaded.storage.compression == comp
    assert_same_reads(plain, loaded.storage, max_lost=comp.chain - 1)


@pytest.mark.parametrize("chunk", [1, 9, 40])
def test_same_step_autoreset_chunks_round_trip(chunk):
    """Same-step chunks write each ended episode's final obs between its steps: the frames
    still go into each lane's log in slot order."""
    T, N = 120, 2
    frames = pong_like(T, N, seed=14)
    term, trunc = episodes(T, N, seed=15, mean=6)
    comp = FrameCompression("lz4", delta=True, key_every=4, budget=1.0)
    plain, packed = pair(comp, N, L=30, autoreset="same_step")
    for t in range(0, T, chunk):
        sl = slice(t, t + chunk)
        feed([plain, packed], frames[sl], term[sl], trunc[sl], chunk, False, same_step=True)
        if plain.valid.any():
            assert_same_reads(plain, packed, max_lost=comp.chain - 1)


def test_lz4_decodes_into_a_buffer_as_its_decompressor_does():
    codec = make_codec("lz4")
    assert codec.decode_into is not None  # python-lz4's extension exports LZ4_decompress_safe
    frame = pong_like(1, 1, seed=3)[0, 0].reshape(-1)
    payload = np.frombuffer(codec.compress(frame), np.uint8).copy()
    out = np.zeros(frame.size + 8, np.uint8)  # 8 guard bytes stay untouched
    n = codec.decode_into(payload.ctypes.data, out.ctypes.data, payload.size, frame.size)
    assert n == frame.size
    np.testing.assert_array_equal(out[: frame.size], frame)
    np.testing.assert_array_equal(out[: frame.size], np.frombuffer(
        codec.decompress(payload, frame.size), np.uint8))  # fmt: skip
    assert not out[frame.size :].any()
    bad = codec.decode_into(payload.ctypes.data, out.ctypes.data, payload.size - 3, frame.size)
    assert bad != frame.size  # a cut payload is an error, never a short frame


@pytest.mark.parametrize("joined", [True, False])
@pytest.mark.parametrize("delta", [False, True])
def test_reads_in_runs_per_payload_and_as_bytes_are_equal(delta, joined, monkeypatch):
    """The lz4 read paths read the same: the runs of a read copied into one piece and
    decoded in one call (joined), one call per run of payloads (the block stream), one
    ctypes call per payload (decode_into), and bytes objects (decompressor)."""
    from rlstash.storage import frames

    if not joined:
        monkeypatch.setattr(frames, "JOIN_BYTES", 0)
    T, N = 120, 3
    frames_ = pong_like(T, N, seed=4)
    term, trunc = episodes(T, N, seed=5)
    comp = FrameCompression("lz4", delta=delta, key_every=4, budget=1.0)
    plain, packed = pair(comp, N)
    feed([plain, packed], frames_, term, trunc, 5, False)
    arena = packed.backing.arenas["obs"]
    assert arena.codec.decode_into is not None and arena._stream is not None and arena.hdr == 4
    assert not arena.raw.any()
    stream, calls = arena._stream, []

    class Spy:  # (C calls, frames decoded) of each call
        def decode(self, srcs, sizes, dsts, room, want):
            calls.append((len(srcs), int(want.sum()) // arena.F))
            return stream.decode(srcs, sizes, dsts, room, want)

        def decode_piece(self, src, dst, room, want):
            calls.append((1, want // arena.F))
            return stream.decode_piece(src, dst, room, want)

    arena._stream = Spy()
    idx = np.flatnonzero(packed.valid)
    runs = packed.gather(idx)
    n_calls, n_frames = map(sum, zip(*calls))
    assert n_frames >= 5 * len(idx)
    if joined:  # one piece for the whole read
        assert calls == [(1, n_frames)]
    else:  # ~one run per stack and its next frame
        assert 1 < n_calls < n_frames / 3
    arena._stream = None
    each = packed.gather(idx)
    arena.codec = dataclasses.replace(arena.codec, decode_into=None)
    slow = packed.gather(idx)
    want = plain.read(idx)
    for key in want:
        for got in (runs, each, slow):
            torch.testing.assert_close(got[key], want[key], rtol=0, atol=0, msg=key)


def test_a_corrupt_payload_is_an_error_naming_the_slot():
    T, N = 30, 2
    frames = pong_like(T, N, seed=6)
    term, trunc = np.zeros((T, N), bool), np.zeros((T, N), bool)
    comp = FrameCompression("lz4", budget=1.0)
    _, packed = pair(comp, N)
    feed([packed], frames, term, trunc, 10, False)
    arena = packed.backing.arenas["obs"]
    row = 5 * N  # the stream's row of lane 0, position 5 (slot-major: p * N + e)
    i = int(arena.arena_rows(row))  # its index entry
    arena.size[i] -= 3  # the index cut short: it disagrees with the block header
    rows = np.arange(3, 9) * N  # lane 0, positions 3..8: one run of 6 payloads
    two = np.array([3, 4, 5, 12, 13]) * N  # two runs: first decoded as one piece, then each
    for got in (np.array([row]), rows, two):
        with pytest.raises(RuntimeError, match=r"slot 10 is corrupt \(its lz4 block header says"):
            arena.gather(got)
    stream, arena._stream = arena._stream, None  # one call per payload: lz4 refuses it
    with pytest.raises(RuntimeError, match=r"payload of slot 10 is corrupt \(lz4 decoded"):
        arena.gather(rows)
    arena.size[i] += 3
    arena._stream = stream
    at = int(arena.off[i])  # lane 0: the payload itself garbled, its header right
    arena.data[0, at : at + int(arena.size[i])] = 255
    for got in (rows, two):
        with pytest.raises(RuntimeError, match=r"payload of slot 10 is corrupt \(lz4 "):
            arena.gather(got)


def test_a_corrupt_block_header_is_an_error_and_the_next_read_is_right():
    """A block header that disagrees with the index (a run's bytes no longer one valid piece
    of an LZ4 frame) fails that read only: the decoder restarts for the next one."""
    T, N = 30, 2
    frames = pong_like(T, N, seed=6)
    zeros = np.zeros((T, N), bool)
    plain, packed = pair(FrameCompression("lz4", budget=1.0), N)
    feed([plain, packed], frames, zeros, zeros, 10, False)
    arena = packed.backing.arenas["obs"]
    rows = np.arange(3, 9) * N  # lane 0, positions 3..8
    want = arena.gather(rows).copy()
    i = int(arena.arena_rows(5 * N))  # lane 0, position 5
    at = int(arena.off[i]) - 4  # its block header
    saved = arena.data[0, at : at + 4].copy()
    for bad in (arena.size[i] + 3, arena.size[i] - 1, 0, 1 << 20):
        arena.data[0, at : at + 4] = np.frombuffer(int(bad).to_bytes(4, "little"), np.uint8)
        with pytest.raises(RuntimeError, match=r"payload of slot (10|12|14|16) is corrupt"):
            arena.gather(rows)
        np.testing.assert_array_equal(  # lane 0, positions 10..13: steps 10..13 of env 0
            arena.gather(np.arange(10, 14) * N), frames[10:14, 0]
        )
    arena.data[0, at : at + 4] = saved
    np.testing.assert_array_equal(arena.gather(rows), want)


def test_a_state_saved_without_block_headers_reads_and_writes_on():
    """States saved before payloads had block headers load with that layout (read one
    payload at a time), and the stream goes on writing in it."""
    T, N = 70, 2
    frames = pong_like(T, N, seed=8)
    term, trunc = episodes(T, N, seed=9)
    comp = FrameCompression("lz4", budget=0.5)
    plain, packed = pair(comp, N, L=30)
    packed.backing.arenas["obs"].hdr = 0  # the old layout: payloads only
    feed([plain, packed], frames[:40], term[:40], trunc[:40], 10, False)
    state = packed.state_dict()
    del state["backing"]["block_headers"]
    again = StreamStorage.from_state_dict(state)
    assert again.backing.arenas["obs"].hdr == 0
    assert_same_reads(plain, again, max_lost=0)
    plain = StreamStorage.from_state_dict(plain.state_dict())  # a load cuts open episodes
    feed([plain, again], frames[40:], term[40:], trunc[40:], 10, False)
    assert_same_reads(plain, again, max_lost=0)
    new = StreamStorage.from_state_dict(pair(comp, N, L=30)[1].state_dict())
    assert new.backing.arenas["obs"].hdr == 4  # saved with headers: loads with them


def test_the_block_stream_takes_frames_up_to_4_mib():
    from rlstash.storage.codecs import LZ4BlockStream

    assert LZ4BlockStream.make(84 * 84) is not None and LZ4BlockStream.make(4 << 20) is not None
    assert LZ4BlockStream.make((4 << 20) + 1) is None  # such frames: one call per payload


@pytest.mark.parametrize(
    "flags", [["--compress", "none"], ["--compress", "lz4", "--compress-budget", "0.1"],
              ["--compress", "zstd", "--compress-delta", "--compress-budget", "0.05"]],
)  # fmt: skip
def test_train_and_plan_take_the_same_compress_flags(flags):
    """``rlstash train`` and ``rlstash plan`` read --compress/--compress-budget/--compress-delta
    alike: the run's replay gets the compression the plan sized."""
    from rlstash import cli
    from rlstash.cli.flags import Given
    from rlstash.cli.plan import _plan_compression
    from rlstash.cli.train import settings_from_args

    base = ["--field", "obs=4x16x16:uint8", "--field", "action=:int64", "--layout", "stream"]
    planned = _plan_compression(cli.build_parser().parse_args(["plan", *base, *flags]))
    given = settings_from_args(cli.build_parser().parse_args(["train", *flags]), Given())
    assert given.config().compression() == planned
    assert (planned is None) == (flags[1] == "none")


def test_an_index_entry_outside_the_arena_is_an_error_not_a_read_past_it():
    T, N = 30, 2
    frames = pong_like(T, N, seed=7)
    _, packed = pair(FrameCompression("lz4", budget=1.0), N)
    feed([packed], frames, np.zeros((T, N), bool), np.zeros((T, N), bool), 10, False)
    arena = packed.backing.arenas["obs"]
    i = arena.arena_rows(4)
    saved = arena.off[i]
    arena.off[i] = arena.data.size - 2  # e.g. offsets that do not fit
    with pytest.raises(RuntimeError, match=r"index entry of slot 4 is corrupt"):
        arena.gather(np.array([4]))
    arena.off[i] = saved
    a, b = arena.arena_rows(np.array([3, 4]) * N)  # lane 0, positions 3 and 4
    arena.size[a], arena.size[b] = -8, -2  # negative sizes that chain into one "run" whose
    arena.off[b] = arena.off[a] - 4  # byte count would be -2 (a huge size_t to the decoder)
    with pytest.raises(RuntimeError, match=r"index entry of slot 6 is corrupt"):
        arena.gather(np.array([3, 4]) * N)
    with pytest.raises(ValueError, match="out: expected a C-contiguous uint8 array"):
        arena.gather(np.array([1, 2]), np.zeros((2, H, W * 2), np.uint8)[:, :, ::2])
