"""Plan before allocate (invariant I2): exact bytes per place, what is free, fits or not.

A storage of ``capacity`` rows of a :class:`~rlstash.spec.Spec` needs exactly

    bytes(field) = capacity * prod(field.shape) * itemsize(field.dtype)

per field, all on one *place*: ``"ram"`` (a CPU tensor), ``"cuda:N"`` (a tensor on GPU N),
``"disk"`` (memory-mapped files under ``path``) or ``"/dev/shm"`` (shared memory; its pages
are RAM too, so a shm storage is charged to ``"ram"`` as well). Callers add other named
byte counts to any place with ``extra`` (e.g. networks on ``"cuda:0"``), and the host-RAM
bookkeeping that grows with the capacity with ``overhead`` (a stream storage's lanes) and
``sampler`` (its ``plan_bytes(capacity)``: the prioritized sampler's sum tree, masks and
parked priorities, ~19 B per row)::

    p = plan(spec, 1_000_000, storage="ram", extra={"cuda:0": {"networks": 80_000_000}},
             sampler=PrioritizedSampler())

The plan covers what grows with the capacity and is kept; scratch made per sampled batch
(``O(batch_size)``: output tensors, index arrays) is not part of it. Whatever else is sized by
a setting (a sampler's or a tiered storage's per-row arrays, a rollout, an agent's networks)
goes through :func:`check_needs` before it is allocated: one refusal naming the numbers and
the fix.
    print(p.format_table())
    p.check()            # raises InsufficientMemoryError naming numbers and the fix

What is free is measured when the plan is made:

- ``"ram"``: ``min(psutil.virtual_memory().available, cgroup limit - cgroup usage)``; the
  cgroup usage leaves out inactive file cache (reclaimable), as ``docker stats`` does.
- ``"cuda:N"``: ``torch.cuda.mem_get_info(N)``, called *only* when a CUDA place is named.
- ``"disk"``: ``shutil.disk_usage`` of the nearest existing parent of ``path``.
- ``"/dev/shm"``: ``shutil.disk_usage("/dev/shm")``.

A place fits when ``needed <= usable`` with ``usable = free - floor(margin * free)``. The
margin (default 5%) applies to RAM, GPUs and /dev/shm, whose free memory is shared with the
rest of the process (allocator slack, CUDA context, other tensors). Disk has no margin:
files are reserved in full at creation, so the number checked is the number used.
"""

from __future__ import annotations

import math
import os
import shutil
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import psutil
import torch

from rlstash.cgroup import cgroup_available
from rlstash.core import PlansMemory, check_capacity
from rlstash.spec import Spec, dtype_name

STORAGE_KINDS = ("ram", "disk", "shm")


class InsufficientMemoryError(MemoryError):
    """A place does not have the free bytes a storage needs.

    Attributes: ``place``, ``needed`` and ``free`` (bytes, of the first place that does not
    fit) and ``plan`` (the whole :class:`MemoryPlan`; None from :func:`check_host_state`).
    """

    def __init__(
        self, message: str, place: str, needed: int, free: int, plan: MemoryPlan | None
    ) -> None:
        super().__init__(message)
        self.place, self.needed, self.free, self.plan = place, needed, free, plan


def human_bytes(n: int | float) -> str:
    """``1536`` -> ``"1.5 KiB"`` (binary units; whole bytes below 1 KiB)."""
    n = float(n)
    if abs(n) < 1024:
        return f"{int(n)} B"
    for unit in ("KiB", "MiB", "GiB", "TiB", "PiB"):
        n /= 1024.0
        if abs(n) < 1024 or unit == "PiB":
            break
    return f"{n:.1f} {unit}"


def exact_bytes(n: int) -> str:
    """``1536`` -> ``"1,536 bytes (1.5 KiB)"``: exact and human-readable at once."""
    return f"{n:,} bytes ({human_bytes(n)})"


# ----------------------------------------------------------------------------- free memory
def ram_available() -> int:
    """Bytes of RAM this process can allocate now (psutil's available, capped by cgroups)."""
    avail = int(psutil.virtual_memory().available)
    limit = cgroup_available()
    return avail if limit is None else min(avail, limit)


_CHECK_FROM = 1 << 20  # host state below this many bytes is allocated without asking


def check_needs(
    what: str,
    needs: Mapping[str, Mapping[str, int]],
    fix: str,
    path: str | os.PathLike | None = None,
    margin: float = 0.05,
    allow_overcommit: bool = False,
) -> None:
    """Refuse ``needs`` (``{place: {item: bytes}}``: what ``what`` is about to allocate)
    before it is allocated when a place does not have the bytes free: one
    :class:`InsufficientMemoryError` line naming the place, the bytes needed (by item) and
    free, and ``fix``. Places as in :func:`plan` (a device, ``"ram"``, ``"disk"`` under
    ``path``); below 1 MiB a place is not measured. The check the storages' and samplers'
    bookkeeping and the agents' networks go through (:func:`plan` covers storages' data)."""
    for place, items in needs.items():
        where = place_of(place)
        needed = sum(items.values())
        if needed < _CHECK_FROM or allow_overcommit:
            continue
        free, _note = _free_of(where, path)
        if free is None:
            continue
        keep = 0.0 if where == "disk" else margin
        usable = free - math.floor(keep * free)
        if needed <= usable:
            continue
        parts = ", ".join(f"{k} {human_bytes(v)}" for k, v in items.items() if v)
        room = f" ({human_bytes(usable)} usable with a {margin:.0%} safety margin)" if keep else ""
        kind = "space" if where in ("disk", "/dev/shm") else "memory"
        raise InsufficientMemoryError(
            f"Not enough {kind} on {where} for {what}: needs {exact_bytes(needed)} ({parts}), "
            f"{exact_bytes(free)} free{room}. Fix: {fix}",
            where,
            needed,
            free,
            None,
        )


def check_host_state(
    what: str, items: Mapping[str, int], capacity: int, margin: float = 0.05
) -> None:
    """Refuse per-row host state (a sampler's arrays) that does not fit in free RAM, before
    it is allocated: :class:`InsufficientMemoryError` naming the bytes, the parts and the fix
    (the capacity that fits)."""
    needed = sum(items.values())
    if needed < _CHECK_FROM:
        return
    free = ram_available()
    usable = free - math.floor(margin * free)
    per_row = needed / capacity
    check_needs(
        f"{what} of {capacity:,} rows",
        {"ram": items},
        f"capacity <= {max(int(usable // per_row), 0):,} fits ({per_row:.1f} B per row); or "
        "free memory first (rlstash plan --sampler shows it all).",
        margin=margin,
    )


def disk_free(path: str | os.PathLike) -> int:
    """Free bytes on the filesystem that holds ``path`` (or its nearest existing parent)."""
    here = Path(path).absolute()
    while not here.exists() and here != here.parent:
        here = here.parent
    return int(shutil.disk_usage(here).free)


def shm_free() -> int:
    """Free bytes in ``/dev/shm``."""
    return int(shutil.disk_usage("/dev/shm").free)


def cuda_free(index: int) -> tuple[int, str]:
    """(free bytes, note) of GPU ``index``. Only ever called when a CUDA place is named."""
    if not torch.cuda.is_available():
        return 0, "CUDA is not available on this machine"
    count = torch.cuda.device_count()
    if index >= count:
        return 0, f"no such GPU: this machine has {count} CUDA device(s)"
    free, _total = torch.cuda.mem_get_info(index)
    return int(free), ""


def place_of(device: str | torch.device) -> str:
    """The place name of a torch device: ``cpu`` -> ``"ram"``, ``cuda`` -> ``"cuda:N"``."""
    if isinstance(device, str) and device in ("ram", "disk", "/dev/shm"):
        return device
    dev = torch.device(device)
    if dev.type == "cpu":
        return "ram"
    if dev.type == "cuda":
        index = dev.index
        if index is None:  # "cuda" means the current GPU
            index = torch.cuda.current_device() if torch.cuda.is_available() else 0
        return f"cuda:{index}"
    return str(dev)


def _free_of(place: str, path: str | os.PathLike | None) -> tuple[int | None, str]:
    if place == "ram":
        return ram_available(), ""
    if place == "disk":
        return disk_free(path), ""
    if place == "/dev/shm":
        return shm_free(), ""
    if place.startswith("cuda:"):
        return cuda_free(int(place.split(":", 1)[1]))
    if place == "meta":
        return None, "meta tensors hold no data"
    return None, f"free memory of {place} is unknown; not checked"


# ----------------------------------------------------------------------------- the plan
@dataclass
class PlaceUsage:
    """Bytes needed on one place against what is free there."""

    place: str
    needed: int
    free: int | None  # None: unknown or unlimited (not checked)
    fits: bool
    usable: int | None = None  # free minus the safety margin
    items: dict[str, int] = field(default_factory=dict)  # what the needed bytes are
    note: str = ""


@dataclass
class MemoryPlan:
    """Exact bytes of a storage per field and per place, and whether each place fits."""

    spec: Spec
    capacity: int
    storage: str
    device: str
    path: str | None
    fields: dict[str, int]  # field -> exact bytes of capacity rows
    places: list[PlaceUsage]
    margin: float
    overhead: dict[str, int] = field(default_factory=dict)  # host bookkeeping, grows with rows

    @property
    def nbytes(self) -> int:
        """Bytes of the storage's data (all fields)."""
        return sum(self.fields.values())

    @property
    def total(self) -> int:
        """Every byte allocated in RAM, on GPUs and on disk: data, bookkeeping, sampler state and
        ``extra`` items (a shm storage's data counted once, though charged to /dev/shm and RAM)."""
        every = sum(sum(p.items.values()) for p in self.places)
        return every - (self.nbytes if self.storage == "shm" else 0)

    @property
    def fits(self) -> bool:
        """True when every place fits."""
        return all(p.fits for p in self.places)

    def place(self, name: str) -> PlaceUsage:
        """The :class:`PlaceUsage` of place ``name``."""
        for p in self.places:
            if p.place == name:
                return p
        raise KeyError(
            f"place {name!r} is not in this plan (places: {[p.place for p in self.places]})"
        )

    def max_capacity(self, place: str) -> int | None:
        """Largest capacity whose data (plus the other items) fits on ``place``."""
        p = self.place(place)
        row = sum(self.spec[k].row_bytes for k in self.fields if k in p.items)
        scaled = sum(v for k, v in p.items.items() if k in self.overhead)  # grows with rows
        if p.usable is None or row + scaled == 0:
            return None
        other = p.needed - row * self.capacity - scaled
        return max(int((p.usable - other) // (row + scaled / self.capacity)), 0)

    def check(self, allow_overcommit: bool = False, places: Any = None) -> MemoryPlan:
        """Return ``self`` if every place (of ``places``, default all) fits (or
        ``allow_overcommit``), else raise.

        Raises :class:`InsufficientMemoryError` naming the place, the bytes needed and free
        (exact and human-readable) and the fix.
        """
        bad = [p for p in self.places if not p.fits and (places is None or p.place in places)]
        if not bad or allow_overcommit:
            return self
        lines = [self._shortfall(p) for p in bad]
        first = bad[0]
        message = "\n".join(lines) + "\nFix: " + "; or ".join(self._fixes(first)) + "."
        raise InsufficientMemoryError(message, first.place, first.needed, first.free or 0, self)

    def _shortfall(self, p: PlaceUsage) -> str:
        what = f"a {self.storage} storage of {self.capacity:,} rows"
        kind = "space" if p.place in ("disk", "/dev/shm") else "memory"
        where = f"disk at {self.path}" if p.place == "disk" else p.place
        text = (
            f"Not enough {kind} on {where} for {what}: needs {exact_bytes(p.needed)}, "
            f"{exact_bytes(p.free or 0)} free"
        )
        if p.usable is not None and p.usable != p.free:
            text += f" ({human_bytes(p.usable)} usable with a {self.margin:.0%} safety margin)"
        if p.note:
            text += f" [{p.note}]"
        others = {k: v for k, v in p.items.items() if k not in self.fields}
        if others:
            text += "; besides the data: " + ", ".join(
                f"{k} {human_bytes(v)}" for k, v in others.items()
            )
        return text + "."

    def _fixes(self, p: PlaceUsage) -> list[str]:
        fixes = []
        n = self.max_capacity(p.place)
        row = sum(self.spec[k].row_bytes for k in self.fields if k in p.items)
        if n:
            fixes.append(f"capacity <= {n:,} fits ({human_bytes(row)} per row)")
        elif row:
            fixes.append("free memory on this place first: not even one row fits")
        if p.place == "ram" and self.storage in ("ram", "shm"):
            fixes.append(
                "storage='disk' (MemmapStorage) with a path on a disk with enough free space"
            )
        if p.place.startswith("cuda"):
            fixes.append("device='cpu' (keep the data in RAM and deliver batches to the GPU)")
        if p.place == "disk":
            fixes.append("a path on a filesystem with more free space")
        for name, f in self.spec.items():
            nbytes = self.fields[name]
            if f.dtype.is_floating_point and len(f.shape) >= 2 and nbytes * 4 >= p.needed:
                saved = nbytes - nbytes // f.itemsize
                fixes.append(
                    f"store field {name!r} ({f.describe()}) as uint8 pixels: saves {human_bytes(saved)}"
                )
        if p.place != "disk":  # disk files are reserved in full: overcommit cannot help there
            fixes.append("allow_overcommit=True to allocate anyway (the process may be killed)")
        return fixes

    def format_table(self) -> str:
        """A readable text table: one row per field, then one row per place."""
        head = ("field", "shape", "dtype", "bytes/row", "bytes", "")
        rows = [head]
        for name, f in self.spec.items():
            shape = "x".join(map(str, f.shape)) or "()"
            n = self.fields[name]
            rows.append(
                (name, shape, dtype_name(f.dtype), f"{f.row_bytes:,}", f"{n:,}", human_bytes(n))
            )
        total = self.nbytes
        rows.append(("total", "", "", f"{self.spec.row_bytes:,}", f"{total:,}", human_bytes(total)))
        if self.overhead:
            for name, n in self.overhead.items():
                per_row = f"{n / self.capacity:,.2f}"
                rows.append((name, "", "", per_row, f"{n:,}", human_bytes(n)))
            n = total + sum(self.overhead.values())
            per_row = f"{n / self.capacity:,.2f}"
            rows.append(("total with bookkeeping", "", "", per_row, f"{n:,}", human_bytes(n)))
        out = [_columns(rows, right={3, 4})]
        out.append(
            f"storage: {self.storage}, capacity {self.capacity:,} rows, device {self.device}"
        )
        prow = [("place", "needed", "free", "usable", "fits", "note")]
        for p in self.places:
            free = "unknown" if p.free is None else human_bytes(p.free)
            usable = "-" if p.usable is None else human_bytes(p.usable)
            fits = "yes" if p.fits else "NO"
            others = [f"{k} {human_bytes(v)}" for k, v in p.items.items() if k not in self.fields]
            note = "; ".join(
                x for x in (("incl. " + ", ".join(others)) if others else "", p.note) if x
            )
            prow.append((p.place, human_bytes(p.needed), free, usable, fits, note))
        out.append(_columns(prow, right={1, 2, 3}))
        return "\n\n".join(out)


def _columns(rows: list[tuple[str, ...]], right: set[int]) -> str:
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    lines = []
    for r in rows:
        cells = [
            c.rjust(w) if i in right else c.ljust(w) for i, (c, w) in enumerate(zip(r, widths))
        ]
        lines.append("  ".join(cells).rstrip())
    return "\n".join(lines)


def plan(
    spec: Spec | Mapping,
    capacity: int,
    storage: str = "ram",
    device: str | torch.device = "cpu",
    path: str | os.PathLike | None = None,
    extra: Mapping[str, Mapping[str, int]] | None = None,
    margin: float = 0.05,
    overhead: Mapping[str, int] | None = None,
    sampler: Any = None,
) -> MemoryPlan:
    """Plan a storage: exact bytes per field and per place, and what is free there now.

    Args:
        spec: the rows' fields (a :class:`Spec` or anything ``Spec()`` accepts).
        capacity: rows of the storage (> 0).
        storage: ``"ram"`` (a tensor on ``device``), ``"disk"`` (files under ``path``) or
            ``"shm"`` (``/dev/shm``, charged to ``"ram"`` too).
        device: where a ``"ram"`` storage's tensors live (``"cpu"``, ``"cuda:0"``, ...);
            disk and shm storages live on the CPU.
        path: the directory of a disk storage (required for ``storage="disk"``).
        extra: more bytes per place, ``{place_or_device: {name: bytes}}``, e.g.
            ``{"cuda:0": {"networks": 80_000_000}}``.
        margin: fraction of free RAM / GPU / shm memory kept in reserve (disk: none).
        overhead: host-RAM bookkeeping of the storage that grows with ``capacity``, by name
            (e.g. a stream storage's lanes: ``StreamStorage.plan_bytes(...)["bookkeeping"]``).
        sampler: the buffer's sampler; its ``plan_bytes(capacity)`` (per-row state it will
            allocate in host RAM when bound) is charged to ``"ram"`` as ``sampler: <name>``.

    Only the places named (by ``device`` or ``extra``) are queried: with every device on
    the CPU, no CUDA call is made.
    """
    spec = spec if isinstance(spec, Spec) else Spec(spec)
    dev = _check_plan_args(capacity, storage, device, path, margin)
    fields = spec.field_nbytes(capacity)
    grows = _overhead(overhead, sampler, capacity)
    charged = _charge(fields, storage, place_of(dev), extra, grows)
    places = [_usage(where, items, storage, path, margin) for where, items in charged.items()]
    return MemoryPlan(
        spec,
        capacity,
        storage,
        str(dev),
        None if path is None else str(path),
        fields,
        places,
        margin,
        grows,
    )


def _check_plan_args(
    capacity: int,
    storage: str,
    device: str | torch.device,
    path: str | os.PathLike | None,
    margin: float,
) -> torch.device:
    """Refuse what :func:`plan` cannot plan; return the storage's device."""
    check_capacity(capacity)
    if storage not in STORAGE_KINDS:
        raise ValueError(f"storage: expected one of {list(STORAGE_KINDS)}, got {storage!r}")
    if not 0.0 <= margin < 1.0:
        raise ValueError(f"margin: expected a fraction in [0, 1), got {margin!r}")
    dev = torch.device(device)
    if storage != "ram" and dev.type != "cpu":
        raise ValueError(
            f"device: a {storage} storage lives on the CPU, got device {str(dev)!r}; "
            "deliver batches to a device when sampling, or use storage='ram' with that device"
        )
    if storage == "disk" and path is None:
        raise ValueError("path: a disk storage needs a directory path, got None")
    return dev


def _charge(
    fields: Mapping[str, int],
    storage: str,
    device_place: str,
    extra: Mapping[str, Mapping[str, int]] | None,
    grows: Mapping[str, int],
) -> dict[str, dict[str, int]]:
    """Bytes by place, then by name: the fields where the storage lives (shm: also RAM),
    ``extra`` where it says, the bookkeeping that grows with capacity in RAM."""
    main = {"ram": device_place, "disk": "disk", "shm": "/dev/shm"}[storage]
    charged: dict[str, dict[str, int]] = {main: dict(fields)}
    if storage == "shm":
        charged["ram"] = dict(fields)
    for where, items in (extra or {}).items():
        bucket = charged.setdefault(place_of(where), {})
        for name, nbytes in items.items():
            if not isinstance(nbytes, int) or isinstance(nbytes, bool) or nbytes < 0:
                raise ValueError(f"extra[{where!r}][{name!r}]: expected bytes >= 0, got {nbytes!r}")
            bucket[name] = bucket.get(name, 0) + nbytes
    if grows:
        bucket = charged.setdefault("ram", {})
        for name, nbytes in grows.items():
            bucket[name] = bucket.get(name, 0) + nbytes
    return charged


def _usage(
    where: str,
    items: dict[str, int],
    storage: str,
    path: str | os.PathLike | None,
    margin: float,
) -> PlaceUsage:
    """What ``items`` need at ``where`` against what is free there now, less the margin
    (none on disk)."""
    needed = sum(items.values())
    free, note = _free_of(where, path)
    if where == "ram" and storage == "shm":
        note = note or "/dev/shm pages are RAM"
    keep = 0.0 if where == "disk" else margin
    usable = None if free is None else free - math.floor(keep * free)
    fits = usable is None or needed <= usable
    return PlaceUsage(where, needed, free, fits, usable, items, note)


def _overhead(overhead: Mapping[str, int] | None, sampler: Any, capacity: int) -> dict[str, int]:
    """``overhead`` plus the sampler's ``plan_bytes(capacity)`` (as ``sampler: <name>``)."""
    out: dict[str, int] = {}
    for name, nbytes in (overhead or {}).items():
        if not isinstance(nbytes, int) or isinstance(nbytes, bool) or nbytes < 0:
            raise ValueError(f"overhead[{name!r}]: expected bytes >= 0, got {nbytes!r}")
        out[name] = nbytes
    if sampler is not None:
        if not isinstance(sampler, PlansMemory):
            raise TypeError(
                f"sampler: {type(sampler).__name__} has no plan_bytes(capacity), so its memory "
                "cannot be planned; give its bytes in overhead={...} instead"
            )
        for name, nbytes in sampler.plan_bytes(capacity).items():
            out[f"sampler: {name}"] = int(nbytes)
    return out
