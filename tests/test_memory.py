"""memory.plan: exact bytes per field and place, free memory, refusal messages (invariant I2)."""

from __future__ import annotations

import re
import shutil
from pathlib import Path

import pytest
import torch

from rlstash import memory
from rlstash.memory import InsufficientMemoryError, exact_bytes, human_bytes, plan
from rlstash.spec import Field, Spec

SPEC = Spec(
    {
        "obs": Field((3, 64, 64), torch.float32),  # 49,152 bytes per row
        "action": Field((), torch.int64),  # 8
        "reward": Field((), torch.float32),  # 4
        "done": Field((), torch.bool),  # 1
    }
)
ROW = 49_152 + 8 + 4 + 1


@pytest.mark.parametrize(
    "n, text",
    [(0, "0 B"), (1023, "1023 B"), (1024, "1.0 KiB"), (1536, "1.5 KiB"), (3 << 30, "3.0 GiB")],
)
def test_human_bytes(n, text):
    assert human_bytes(n) == text


def test_exact_bytes():
    assert exact_bytes(1_536) == "1,536 bytes (1.5 KiB)"


def test_plan_bytes_are_exact_per_field_and_place():
    p = plan(SPEC, 1_000, extra={"cpu": {"networks": 5_000}})
    assert p.fields == {"obs": 49_152_000, "action": 8_000, "reward": 4_000, "done": 1_000}
    assert p.nbytes == SPEC.nbytes(1_000) == ROW * 1_000
    ram = p.place("ram")
    assert ram.needed == ROW * 1_000 + 5_000
    assert ram.items["networks"] == 5_000
    assert [x.place for x in p.places] == ["ram"]


def test_shm_storage_is_charged_to_shm_and_ram(monkeypatch):
    monkeypatch.setattr(memory, "shm_free", lambda: 10**12)
    monkeypatch.setattr(memory, "ram_available", lambda: 10**12)
    p = plan(SPEC, 10, storage="shm")
    assert [x.place for x in p.places] == ["/dev/shm", "ram"]
    assert p.place("/dev/shm").needed == p.place("ram").needed == ROW * 10
    assert p.place("/dev/shm").free == 10**12


def test_disk_free_is_measured_at_nearest_existing_parent(tmp_path, monkeypatch):
    asked = []
    real = shutil.disk_usage

    def spy(path):
        asked.append(Path(path))
        return real(path)

    monkeypatch.setattr(shutil, "disk_usage", spy)
    p = plan(SPEC, 10, storage="disk", path=tmp_path / "a" / "b")
    assert asked == [tmp_path]
    assert abs(p.place("disk").free - real(tmp_path).free) < 64 << 20  # others write too
    assert p.place("disk").usable == p.place("disk").free  # no margin on disk


def test_plan_refuses_with_numbers_and_fix(monkeypatch):
    free = 20 * ROW + 123  # room for 19 rows after the 5% margin
    monkeypatch.setattr(memory, "ram_available", lambda: free)
    p = plan(SPEC, 1_000)
    assert not p.fits and not p.place("ram").fits
    usable = free - int(0.05 * free)
    assert p.place("ram").usable == usable
    assert p.max_capacity("ram") == usable // ROW == 19
    with pytest.raises(InsufficientMemoryError) as info:
        p.check()
    msg = str(info.value)
    assert f"{ROW * 1_000:,} bytes" in msg and f"{free:,} bytes" in msg
    assert "ram" in msg and "capacity <= 19 " in msg
    assert "storage='disk'" in msg
    assert "'obs'" in msg and "uint8" in msg  # the float image field dominates
    assert "allow_overcommit=True" in msg
    err = info.value
    assert (err.place, err.needed, err.free) == ("ram", ROW * 1_000, free)
    assert isinstance(err, MemoryError)
    assert p.check(allow_overcommit=True) is p


def test_extra_bytes_reduce_the_capacity_that_fits(monkeypatch):
    monkeypatch.setattr(memory, "ram_available", lambda: 100 * ROW)
    p = plan(SPEC, 1_000, extra={"ram": {"networks": 50 * ROW}}, margin=0.0)
    assert p.max_capacity("ram") == 50
    with pytest.raises(InsufficientMemoryError, match=r"networks"):
        p.check()


def test_margin_decides_at_the_edge(monkeypatch):
    monkeypatch.setattr(memory, "ram_available", lambda: ROW * 100)
    assert plan(SPEC, 100, margin=0.0).fits
    assert not plan(SPEC, 100).fits  # the default 5% margin keeps room for the rest


def test_no_uint8_hint_for_small_vector_fields(monkeypatch):
    monkeypatch.setattr(memory, "ram_available", lambda: 10)
    with pytest.raises(InsufficientMemoryError) as info:
        plan({"obs": ((17,), torch.float32)}, 1_000).check()
    assert "uint8" not in str(info.value)
    assert "not even one row fits" in str(info.value)


@pytest.mark.parametrize(
    "kwargs, err, text",
    [
        ({"capacity": 0}, ValueError, "capacity"),
        ({"capacity": 2.5}, ValueError, "capacity"),
        ({"storage": "gpu"}, ValueError, "storage"),
        ({"storage": "disk"}, ValueError, "path"),
        ({"storage": "shm", "device": "meta"}, ValueError, "device"),
        ({"extra": {"ram": {"x": -1}}}, ValueError, "extra"),
        ({"margin": 1.0}, ValueError, "margin"),
    ],
)
def test_plan_bad_arguments(kwargs, err, text):
    args = {"spec": SPEC, "capacity": 10, **kwargs}
    with pytest.raises(err, match=text):
        plan(**args)


def test_format_table_lists_fields_and_places(monkeypatch):
    monkeypatch.setattr(memory, "ram_available", lambda: 10)
    table = plan(SPEC, 1_000, extra={"ram": {"networks": 7}}).format_table()
    assert re.search(r"obs\s+3x64x64\s+float32\s+49,152\s+49,152,000", table)
    assert re.search(r"done\s+\(\)\s+bool\s+1\s+1,000", table)
    assert re.search(r"ram\s+.*NO\s+incl. networks 7 B", table)


def test_unknown_and_meta_places_are_not_checked():
    p = plan(SPEC, 10**9, device="meta")
    assert p.places[0].place == "meta" and p.places[0].free is None and p.fits


@pytest.mark.allow_cuda
def test_cuda_place_uses_mem_get_info_of_that_device(monkeypatch):
    asked = []
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)
    monkeypatch.setattr(torch.cuda, "mem_get_info", lambda i: (asked.append(i) or 1_000, 2_000))
    monkeypatch.setattr(memory, "ram_available", lambda: 10**12)
    p = plan(SPEC, 10, device="cuda:1", extra={"cpu": {"x": 1}})
    assert asked == [1]
    assert [x.place for x in p.places] == ["cuda:1", "ram"]
    assert p.place("cuda:1").free == 1_000 and not p.place("cuda:1").fits
    with pytest.raises(InsufficientMemoryError, match="device='cpu'"):
        p.check()
    p = plan(SPEC, 10, device="cuda:5")
    assert p.place("cuda:5").free == 0 and "no such GPU" in p.place("cuda:5").note


@pytest.mark.allow_cuda
def test_cuda_named_without_cuda_is_reported(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    with pytest.raises(InsufficientMemoryError, match="CUDA is not available"):
        plan(SPEC, 10, device="cuda:0").check()


def test_cpu_plan_makes_no_cuda_call():
    # the autouse tripwire fails this test if any torch.cuda API is touched
    plan(SPEC, 10, storage="ram", device="cpu", extra={"cpu": {"net": 1}}).check()
    plan(SPEC, 10, storage="shm").check(allow_overcommit=True)


# ----------------------------------------------------------------------------- cgroups
def _write(root: Path, files: dict[str, str]) -> None:
    for rel, text in files.items():
        path = root / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)


def test_cgroup_v2_takes_the_tightest_level(tmp_path):
    _write(
        tmp_path,
        {
            "proc": "0::/user.slice/job\n",
            "cg/cgroup.controllers": "memory\n",
            "cg/memory.max": "max\n",
            "cg/user.slice/memory.max": "1000000\n",
            "cg/user.slice/memory.current": "400000\n",
            "cg/user.slice/memory.stat": "anon 1\ninactive_file 100000\n",
            "cg/user.slice/job/memory.max": "900000\n",
            "cg/user.slice/job/memory.current": "200000\n",
            "cg/user.slice/job/memory.stat": "inactive_file 0\n",
        },
    )
    # job: 900000 - 200000 = 700000; user.slice: 1000000 - (400000 - 100000) = 700000 - 0
    assert memory.cgroup_available(tmp_path / "cg", tmp_path / "proc") == 700_000
    (tmp_path / "cg/user.slice/memory.current").write_text("600000\n")
    assert memory.cgroup_available(tmp_path / "cg", tmp_path / "proc") == 500_000


def test_cgroup_v2_without_limit_is_none(tmp_path):
    _write(
        tmp_path,
        {
            "proc": "0::/\n",
            "cg/cgroup.controllers": "",
            "cg/memory.max": "max\n",
            "cg/memory.current": "5\n",
        },
    )
    assert memory.cgroup_available(tmp_path / "cg", tmp_path / "proc") is None


def test_cgroup_v1_limit_and_no_limit(tmp_path):
    _write(
        tmp_path,
        {
            "proc": "4:memory:/docker/abc\n0::/\n",
            "cg/memory/docker/abc/memory.limit_in_bytes": "2000000\n",
            "cg/memory/docker/abc/memory.usage_in_bytes": "1500000\n",
            "cg/memory/docker/abc/memory.stat": "hierarchical_memory_limit 3000000\n"
            "total_inactive_file 500000\n",
        },
    )
    assert memory.cgroup_available(tmp_path / "cg", tmp_path / "proc") == 1_000_000
    (tmp_path / "cg/memory/docker/abc/memory.limit_in_bytes").write_text("9223372036854771712\n")
    assert memory.cgroup_available(tmp_path / "cg", tmp_path / "proc") == 2_000_000  # hierarchy
    (tmp_path / "cg/memory/docker/abc/memory.stat").write_text("total_inactive_file 0\n")
    assert memory.cgroup_available(tmp_path / "cg", tmp_path / "proc") is None


def test_cgroup_missing_files_is_none(tmp_path):
    assert memory.cgroup_available(tmp_path / "nope", tmp_path / "nope") is None


def test_ram_available_is_capped_by_the_cgroup(monkeypatch):
    class VM:
        available = 10_000

    monkeypatch.setattr(memory.psutil, "virtual_memory", lambda: VM)
    monkeypatch.setattr(memory, "cgroup_available", lambda: 4_000)
    assert memory.ram_available() == 4_000
    monkeypatch.setattr(memory, "cgroup_available", lambda: None)
    assert memory.ram_available() == 10_000


def test_real_ram_available_is_plausible():
    assert 0 < memory.ram_available() <= memory.psutil.virtual_memory().total


# ------------------------------------------- every byte planned is a byte allocated (issue 9)
def _array_bytes(*objs) -> int:
    """Bytes of every numpy array and torch tensor reachable from ``objs``' attributes, each
    buffer counted once (views and reshapes resolve to the array that owns the memory)."""
    import numpy as np

    seen_obj, owners, total = set(), {}, 0
    stack = list(objs)
    while stack:
        o = stack.pop()
        if id(o) in seen_obj:
            continue
        seen_obj.add(id(o))
        if isinstance(o, np.ndarray):
            while isinstance(o.base, np.ndarray):
                o = o.base
            owners[id(o)] = o.nbytes
        elif isinstance(o, torch.Tensor):
            st = o.untyped_storage()
            owners[st.data_ptr()] = st.nbytes()
        elif isinstance(o, dict):
            stack.extend(o.values())
        elif isinstance(o, list | tuple):
            stack.extend(o)
        elif type(o).__module__.startswith("rlstash"):
            stack.extend(vars(o).values())
    total = sum(owners.values())
    return total


@pytest.mark.parametrize("capacity", [1, 7, 1000, 65_537, 1_000_003])
def test_prioritized_sampler_plan_bytes_equal_what_reset_allocates(capacity):
    import tracemalloc

    from rlstash.sampler import PrioritizedSampler

    s = PrioritizedSampler()
    planned = sum(s.plan_bytes(capacity).values())
    tracemalloc.start()
    try:
        s.reset(capacity)
        traced, _ = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert _array_bytes(s) == planned
    assert planned <= traced <= planned + 16_384  # nothing big allocated besides (Python objects)
    if capacity > 10**6:
        assert 18.5 <= planned / capacity <= 19.5  # ~19 B per row


@pytest.mark.parametrize("sampler", ["uniform", "epochs", "sequence", "prioritized"])
def test_plan_of_a_buffer_equals_the_bytes_it_allocates(sampler):
    from rlstash.replay import ReplayBuffer
    from rlstash.sampler import PrioritizedSampler, SequenceSampler, UniformSampler
    from rlstash.storage import TensorStorage

    make = {
        "uniform": UniformSampler,
        "epochs": lambda: UniformSampler(replacement=False),
        "sequence": lambda: SequenceSampler(2, end_keys=("done",)),
        "prioritized": PrioritizedSampler,
    }[sampler]
    cap = 1_000
    p = plan(SPEC, cap, sampler=make())
    rb = ReplayBuffer(TensorStorage(SPEC, cap), make(), seed=0)
    rb.extend(
        {
            "obs": torch.zeros(cap, 3, 64, 64),
            "action": torch.zeros(cap, dtype=torch.int64),
            "reward": torch.zeros(cap),
            "done": torch.zeros(cap, dtype=torch.bool),
        }
    )
    if sampler == "epochs":  # an epoch's permutation is made at the first sample
        rb.sample(10)  # (per-batch scratch, O(batch_size), is not part of a plan)
    allocated = _array_bytes(rb.storage.tensors, rb.sampler)
    assert p.place("ram").needed == allocated
    assert p.total == allocated and p.overhead == {
        f"sampler: {k}": v for k, v in make().plan_bytes(cap).items()
    }


@pytest.mark.parametrize("num_envs, capacity", [(1, 10), (3, 100), (8, 1_000)])
def test_stream_plan_counts_the_lane_bookkeeping_it_allocates(num_envs, capacity):
    from rlstash.storage.stream import StreamStorage

    spec = {"obs": ((4,), torch.float32), "action": ((), torch.int64)}
    planned = StreamStorage.plan_bytes(spec, capacity, num_envs=num_envs)
    store = StreamStorage(spec, num_envs, capacity)
    assert _array_bytes(store.lanes, store._cut) == planned.pop("bookkeeping")
    assert _array_bytes(store.backing.tensors) == sum(planned.values())
    assert store.nbytes == sum(StreamStorage.plan_bytes(spec, capacity, num_envs=num_envs).values())


def test_cli_plan_of_a_prioritized_stream_buffer_equals_what_it_allocates(capsys):
    from rlstash import cli
    from rlstash.replay import ReplayBuffer
    from rlstash.sampler import PrioritizedSampler
    from rlstash.storage.stream import ReadSpec, StreamStorage

    argv = ["plan", "--field", "obs=4x8x8:uint8", "--field", "action=:int64", "--buffer-size"]
    argv += ["999", "--num-envs", "4", "--frame-stack", "4", "--layout", "stream"]
    argv += ["--sampler", "prioritized"]
    args = cli.build_parser().parse_args(argv)
    p, _ = cli.build_plan(args)
    store = StreamStorage(
        {"obs": ((4, 8, 8), torch.uint8), "action": ((), torch.int64)},
        4,
        999,
        reads=ReadSpec(frame_stack=4),
        stacked_input=True,
    )
    rb = ReplayBuffer(store, PrioritizedSampler())
    allocated = _array_bytes(store.backing.tensors, store.lanes, store._cut, rb.sampler)
    assert p.place("ram").needed == p.total == allocated
    assert cli.main(argv) == 0
    out = capsys.readouterr().out
    assert "stream: lane bookkeeping" in out and "sampler: sum tree" in out
    assert f"{allocated:,}" in out


def test_sampler_state_that_does_not_fit_is_refused_before_it_is_allocated(monkeypatch):
    import tracemalloc

    from rlstash.sampler import PrioritizedSampler, SequenceSampler

    cap = 10_000_000  # ~191 MB of priorities
    monkeypatch.setattr(memory, "ram_available", lambda: 100 << 20)
    s = PrioritizedSampler()
    tracemalloc.start()
    try:
        with pytest.raises(
            InsufficientMemoryError, match=r"PrioritizedSampler of 10,000,000 rows"
        ) as info:
            s.reset(cap)
        assert tracemalloc.get_traced_memory()[1] < 1 << 20  # nothing big was allocated
    finally:
        tracemalloc.stop()
    text = str(info.value)
    assert "sum tree" in text and "capacity <= 5,19" in text  # (100 MiB * 0.95) / 19.17 B
    assert info.value.needed == sum(s.plan_bytes(cap).values()) and s.capacity == 0
    with pytest.raises(InsufficientMemoryError, match="SequenceSampler"):
        SequenceSampler(2).reset(200_000_000)


def test_max_capacity_counts_the_sampler_bytes_per_row(monkeypatch):
    from rlstash.sampler import PrioritizedSampler

    monkeypatch.setattr(memory, "ram_available", lambda: 10**9)
    p = plan(SPEC, 10**6, sampler=PrioritizedSampler())
    n = p.max_capacity("ram")
    usable = p.place("ram").usable
    fits = plan(SPEC, n, sampler=PrioritizedSampler())
    assert fits.place("ram").needed <= usable < fits.place("ram").needed + ROW + 20
