"""``--field NAME=SHAPE:DTYPE`` values as a :class:`~rlstash.spec.Spec` (``plan``, ``bench``)."""

from __future__ import annotations

from collections.abc import Sequence

from rlstash.spec import Field, Spec, parse_dtype


def parse_field(text: str) -> tuple[str, Field]:
    """``"obs=4x84x84:uint8"`` -> ("obs", Field((4, 84, 84), uint8)); ``"action=:int64"`` a scalar."""
    name, sep, rest = text.partition("=")
    shape_text, sep2, dtype_text = rest.rpartition(":")
    if not sep or not sep2 or not name or not dtype_text:
        raise ValueError(
            f"--field: expected NAME=SHAPE:DTYPE such as obs=4x84x84:uint8 or action=:int64, got {text!r}"
        )
    try:
        shape = tuple(int(s) for s in shape_text.split("x")) if shape_text else ()
    except ValueError:
        raise ValueError(
            f"--field {name}: shape must be integers joined by 'x' (4x84x84), got {shape_text!r}"
        ) from None
    if any(d < 1 for d in shape):
        raise ValueError(
            f"--field {name}: every dimension must be >= 1, got {shape_text!r}; e.g. 4x84x84, "
            f"or {name}=:{dtype_text} for a scalar"
        )
    try:
        dtype = parse_dtype(dtype_text)
    except TypeError as exc:
        raise ValueError(f"--field {name}: {exc}") from None
    return name, Field(shape, dtype)


def parse_fields(texts: Sequence[str]) -> Spec:
    """A spec from repeated ``--field`` values; a name given twice is an error."""
    fields: dict[str, Field] = {}
    given: dict[str, str] = {}
    for text in texts:
        name, f = parse_field(text)
        if name in fields:
            raise ValueError(
                f"--field {name}: given twice ({given[name]!r} and {text!r}); give one --field "
                "per name"
            )
        fields[name], given[name] = f, text
    return Spec(fields)
