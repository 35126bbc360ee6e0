"""Spec and Field: what a batch looks like, validated eagerly, with exact byte counts.

A batch is a plain ``dict[str, torch.Tensor]`` whose tensors share a leading row dimension.
A :class:`Spec` maps each field name to a :class:`Field` (per-row shape and dtype)::

    spec = Spec({"obs": Field((4, 84, 84), torch.uint8), "action": Field((), torch.int64)})
    batch = spec.validate({"obs": frames, "action": actions})  # casts safely or raises
    spec.nbytes(100_000)  # exact bytes of a storage of that capacity

Validation accepts safe casts (float64 -> float32, int32 -> int64, bool -> any number,
integers into floats, integers into a narrower integer when every value fits) and refuses
anything lossy across kinds (floats into an integer or bool field) with a message that names
the field, what was expected and what came. ``validate(batch, finite=True)`` also refuses
NaN and +-inf in float fields (invariant I10).
"""

from __future__ import annotations

import math
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from rlstash.finite import check_finite

Batch = dict[str, torch.Tensor]

_DTYPE_NAMES: dict[str, torch.dtype] = {
    "bool": torch.bool,
    "uint8": torch.uint8,
    "int8": torch.int8,
    "int16": torch.int16,
    "int32": torch.int32,
    "int64": torch.int64,
    "float16": torch.float16,
    "bfloat16": torch.bfloat16,
    "float32": torch.float32,
    "float64": torch.float64,
}


def dtype_name(dtype: torch.dtype) -> str:
    """``torch.float32`` -> ``"float32"``."""
    return str(dtype).removeprefix("torch.")


def describe_value(value: Any) -> str:
    """What came, for an error message: ``Tensor float32 [2, 3]``, ``ndarray bool (4,)``, else
    the type's name."""
    if isinstance(value, torch.Tensor):
        return f"Tensor {dtype_name(value.dtype)} {list(value.shape)}"
    if isinstance(value, np.ndarray | np.generic):
        return f"{type(value).__name__} {value.dtype} {value.shape}"
    return type(value).__name__


def parse_dtype(value: str | torch.dtype | np.dtype | type) -> torch.dtype:
    """A torch dtype from a torch dtype, a numpy dtype or a name such as ``"uint8"``."""
    if isinstance(value, torch.dtype):
        return value
    if isinstance(value, str) and value.removeprefix("torch.") in _DTYPE_NAMES:
        return _DTYPE_NAMES[value.removeprefix("torch.")]
    try:
        np_dtype = np.dtype(value)
    except TypeError as exc:
        raise TypeError(
            f"dtype: expected a torch dtype, a numpy dtype or one of {sorted(_DTYPE_NAMES)}, "
            f"got {value!r}"
        ) from exc
    if np_dtype.name not in _DTYPE_NAMES:
        raise TypeError(
            f"dtype: {np_dtype.name} is not supported; use one of {sorted(_DTYPE_NAMES)}"
        )
    return _DTYPE_NAMES[np_dtype.name]


def _kind(dtype: torch.dtype) -> str:
    if dtype == torch.bool:
        return "b"
    if dtype.is_floating_point:
        return "f"
    if dtype.is_complex:
        return "c"
    return "i"


@dataclass(frozen=True)
class Field:
    """One field of a batch: the shape of a single row and its dtype."""

    shape: tuple[int, ...]
    dtype: torch.dtype

    def __post_init__(self) -> None:
        shape = _shape_of(self.shape)
        if any(s < 0 for s in shape):
            raise ValueError(f"shape: dimensions must be >= 0, got {shape}")
        object.__setattr__(self, "shape", shape)
        object.__setattr__(self, "dtype", parse_dtype(self.dtype))

    @property
    def itemsize(self) -> int:
        """Bytes of one element."""
        return torch.empty((), dtype=self.dtype).element_size()

    @property
    def row_bytes(self) -> int:
        """Bytes of one row of this field."""
        return math.prod(self.shape) * self.itemsize

    def describe(self) -> str:
        dims = "x".join(str(s) for s in self.shape)
        return f"{dims}:{dtype_name(self.dtype)}" if dims else f":{dtype_name(self.dtype)}"


def _shape_of(shape: Any) -> tuple[int, ...]:
    """A shape as a tuple of ints; TypeError naming what came and the fix (no silent int())."""
    dims = tuple(shape) if isinstance(shape, tuple | list | torch.Size) else None
    if dims is not None and all(
        isinstance(d, int | np.integer) and not isinstance(d, bool) for d in dims
    ):
        return tuple(int(d) for d in dims)
    if isinstance(shape, int | np.integer) and not isinstance(shape, bool):
        fix = f"Field(({int(shape)},), ...)"
    elif dims is not None and all(isinstance(d, float) and d.is_integer() for d in dims):
        fix = f"Field({tuple(int(d) for d in dims)!r}, ...)"
    elif dims is not None and all(isinstance(d, int | float) for d in dims):
        fix = f"Field({tuple(max(int(d), 0) for d in dims)!r}, ...) if that is meant"
    else:
        fix = "Field((4, 84, 84), ...), or Field((), ...) for a scalar"
    raise TypeError(
        f"shape: expected a tuple of ints (one per dimension of a row), got {shape!r}; write {fix}"
    )


class Spec(Mapping[str, Field]):
    """An ordered mapping of field name -> :class:`Field`, with validation and byte counts."""

    def __init__(self, fields: Mapping[str, Field | tuple[Any, Any]]) -> None:
        if not isinstance(fields, Mapping) or not fields:
            raise ValueError(
                f"fields: expected a non-empty mapping of name -> Field, got {fields!r}"
            )
        parsed: dict[str, Field] = {}
        for name, f in fields.items():
            if not isinstance(name, str) or not name:
                raise TypeError(f"field names must be non-empty strings, got {name!r}")
            if not isinstance(f, Field):
                shape, dtype = f
                f = Field(tuple(shape), dtype)
            parsed[name] = f
        self._fields = parsed

    # Mapping protocol
    def __getitem__(self, name: str) -> Field:
        return self._fields[name]

    def __iter__(self) -> Iterator[str]:
        return iter(self._fields)

    def __len__(self) -> int:
        return len(self._fields)

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Spec) and list(self._fields.items()) == list(other._fields.items())

    def __hash__(self) -> int:
        return hash(tuple(self._fields.items()))

    def __repr__(self) -> str:
        inner = ", ".join(f"{k}={v.describe()}" for k, v in self._fields.items())
        return f"Spec({inner})"

    # Sizes
    @property
    def row_bytes(self) -> int:
        """Bytes of one row over all fields."""
        return sum(f.row_bytes for f in self._fields.values())

    def nbytes(self, capacity: int) -> int:
        """Exact bytes of ``capacity`` rows over all fields."""
        return capacity * self.row_bytes

    def field_nbytes(self, capacity: int) -> dict[str, int]:
        """Exact bytes of ``capacity`` rows, per field."""
        return {k: capacity * f.row_bytes for k, f in self._fields.items()}

    # Serialization (used by storage metadata and checkpoints)
    def to_dict(self) -> dict[str, list]:
        return {k: [list(f.shape), dtype_name(f.dtype)] for k, f in self._fields.items()}

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> Spec:
        return cls({k: Field(tuple(v[0]), parse_dtype(v[1])) for k, v in data.items()})

    def select(self, *names: str) -> Spec:
        """A spec with only ``names``, in that order."""
        return Spec({n: self._fields[n] for n in names})

    def merge(self, other: Mapping[str, Field]) -> Spec:
        """A spec with the fields of ``self`` then those of ``other`` (names must not clash)."""
        clash = set(self._fields) & set(other)
        if clash:
            raise ValueError(f"fields: names {sorted(clash)} are defined twice")
        return Spec({**self._fields, **dict(other)})

    # Validation
    def validate(self, batch: Mapping[str, Any], finite: bool = False) -> Batch:
        """Check ``batch`` against the spec and return it as tensors of the spec's dtypes.

        Every field must be present (and no other), shaped ``[N, *field.shape]`` with the
        same ``N`` for all fields. Raises ValueError/TypeError naming the field, the expected
        and the received shape or dtype. With ``finite`` a float field holding NaN or +-inf is
        refused too (:func:`rlstash.finite.check_finite`, a ValueError naming field and row:
        what the buffers' ``extend`` asks for, invariant I10). Nothing is modified in place.
        """
        if not isinstance(batch, Mapping):
            raise TypeError(
                f"batch: expected a dict of field -> tensor, got {type(batch).__name__}"
            )
        missing = [k for k in self._fields if k not in batch]
        extra = [k for k in batch if k not in self._fields]
        if missing or extra:
            raise ValueError(
                f"batch: fields do not match the spec; missing {missing}, unexpected {extra} "
                f"(spec has {list(self._fields)})"
            )
        out: Batch = {}
        rows: int | None = None
        first = ""
        for name, f in self._fields.items():
            value = _as_tensor(name, batch[name])
            want = len(f.shape) + 1
            if value.dim() != want or tuple(value.shape[1:]) != f.shape:
                raise ValueError(
                    f"field {name!r}: expected shape [N, {', '.join(map(str, f.shape))}]"
                    f" ({f.describe()} per row), got shape {list(value.shape)}".replace(
                        "[N, ]", "[N]"
                    )
                )
            if rows is None:
                rows, first = value.shape[0], name
            elif value.shape[0] != rows:
                raise ValueError(
                    f"field {name!r}: has {value.shape[0]} rows but field {first!r} has {rows}; "
                    "all fields of a batch need the same number of rows"
                )
            out[name] = cast_field(name, value, f.dtype)
        if finite:
            check_finite(out)
        return out

    def rows(self, batch: Mapping[str, torch.Tensor]) -> int:
        """Number of rows of a batch that already passed :meth:`validate`."""
        return next(iter(batch.values())).shape[0]

    # Construction from gymnasium spaces
    @classmethod
    def from_space(cls, space: Any, name: str = "obs") -> Spec:
        """Fields for one gymnasium space; Dict and Tuple are flattened as ``name/key``."""
        return cls(space_fields(space, name))

    @classmethod
    def for_transitions(
        cls, observation_space: Any, action_space: Any, next_obs: bool = True
    ) -> Spec:
        """obs, action, reward (float32), terminated, truncated (bool) and optionally next_obs."""
        fields = dict(space_fields(observation_space, "obs"))
        fields.update(space_fields(action_space, "action"))
        fields["reward"] = Field((), torch.float32)
        fields["terminated"] = Field((), torch.bool)
        fields["truncated"] = Field((), torch.bool)
        if next_obs:
            fields.update(space_fields(observation_space, "next_obs"))
        return cls(fields)


def _as_tensor(name: str, value: Any) -> torch.Tensor:
    if isinstance(value, torch.Tensor):
        if value.layout is not torch.strided:
            layout = str(value.layout).removeprefix("torch.")
            raise TypeError(
                f"field {name!r}: expected a dense (strided) tensor, got layout {layout}; "
                "pass value.to_dense()"
            )
        if value.device.type == "meta":
            raise ValueError(
                f"field {name!r}: got a meta tensor of shape {list(value.shape)}, which holds "
                "no data; pass a tensor on a real device (cpu, cuda)"
            )
        return value
    if not isinstance(value, np.ndarray):
        try:
            value = np.asarray(value)
        except Exception as exc:  # noqa: BLE001 - report what came
            raise TypeError(
                f"field {name!r}: expected a tensor or array, got {type(value).__name__}"
            ) from exc
        if value.dtype == object or value.dtype.kind in "USV":
            raise TypeError(
                f"field {name!r}: expected a tensor or array, got {type(value).__name__}"
            )
    if value.dtype == object:
        raise TypeError(f"field {name!r}: expected a numeric array, got an object array")
    try:
        return torch.from_numpy(value)
    except (TypeError, ValueError, RuntimeError) as exc:
        raise TypeError(
            f"field {name!r}: numpy array of dtype {value.dtype.str} cannot become a tensor "
            f"({exc}); convert it first, e.g. value.astype(value.dtype.newbyteorder('='))"
            " for another byte order"
        ) from None


def cast_field(name: str, value: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """Cast ``value`` to ``dtype`` when that is safe, else raise TypeError naming ``name``."""
    if value.dtype == dtype:
        return value
    src, dst = _kind(value.dtype), _kind(dtype)
    if src == dst == "i":
        _check_ints_fit(name, value, dtype)
        return value.to(dtype)
    ok = (src == dst == "f") or (src == "b" and dst in "if") or (src == "i" and dst == "f")
    if not ok:
        raise TypeError(
            f"field {name!r}: expected dtype {dtype_name(dtype)}, got {dtype_name(value.dtype)}"
            " (a lossy cast across kinds is refused; convert the data explicitly)"
        )
    return value.to(dtype)


# integer dtypes torch cannot reduce (min/max) or compare: checked through numpy on the host
_HOST_CHECKED = {torch.uint16, torch.uint32, torch.uint64}


def _check_ints_fit(name: str, value: torch.Tensor, dtype: torch.dtype) -> None:
    """TypeError naming the field and showing the values that do not fit ``dtype``."""
    src, dst = torch.iinfo(value.dtype), torch.iinfo(dtype)
    if (dst.min <= src.min and src.max <= dst.max) or value.numel() == 0:
        return
    if value.dtype in _HOST_CHECKED:
        flat = value.detach().cpu().numpy().ravel()
        bad = flat[flat > dst.max]  # unsigned: nothing below 0
        if not bad.size:
            return
    else:
        if bool(value.min() >= dst.min) and bool(value.max() <= dst.max):
            return
        flat = value.detach().reshape(-1)
        bad = flat[(flat < dst.min) | (flat > dst.max)].cpu()
    wider = next(
        (t for t in (torch.int16, torch.int32, torch.int64) if torch.iinfo(t).bits > dst.bits),
        None,
    )
    fix = f"store it as {dtype_name(wider)} or " if wider is not None else ""
    raise TypeError(
        f"field {name!r}: {bad.shape[0]} of {value.numel()} values do not fit "
        f"{dtype_name(dtype)} [{dst.min}, {dst.max}]: {bad[:5].tolist()}"
        f"{' ...' if bad.shape[0] > 5 else ''}; {fix}clip the values first"
    )


def flat_obs(prefix: str, obs: Any) -> dict[str, Any]:
    """``{prefix: obs}``, or for a dict of observations ``{prefix/key: ...}`` (nested dicts
    joined by ``/``; with an empty ``prefix`` the keys alone), in the dict's order."""
    if not isinstance(obs, Mapping):
        return {prefix: obs}
    out: dict[str, Any] = {}
    for key, value in obs.items():
        out.update(flat_obs(f"{prefix}/{key}" if prefix else str(key), value))
    return out


def space_fields(space: Any, name: str) -> dict[str, Field]:
    """Fields for a gymnasium space (Box, Discrete, MultiDiscrete, MultiBinary, Dict, Tuple)."""
    from gymnasium import spaces

    if isinstance(space, spaces.Dict):
        out: dict[str, Field] = {}
        for key, sub in space.spaces.items():
            out.update(space_fields(sub, f"{name}/{key}"))
        return out
    if isinstance(space, spaces.Tuple):
        out = {}
        for i, sub in enumerate(space.spaces):
            out.update(space_fields(sub, f"{name}/{i}"))
        return out
    if isinstance(space, spaces.Discrete):
        return {name: Field((), torch.int64)}
    if isinstance(space, spaces.MultiDiscrete):
        return {name: Field(tuple(space.nvec.shape), torch.int64)}
    if isinstance(space, spaces.MultiBinary):
        return {name: Field(tuple(space.shape), torch.uint8)}
    if isinstance(space, spaces.Box):
        return {name: Field(tuple(space.shape), parse_dtype(space.dtype))}
    raise TypeError(
        f"space for {name!r}: expected Box, Discrete, MultiDiscrete, MultiBinary, Dict or Tuple, "
        f"got {type(space).__name__}"
    )
