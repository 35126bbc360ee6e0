"""Typed settings dataclasses: one field = its default, its help text, its type check.

A settings dataclass (:class:`rlstash.train.config.TrainConfig`, the agents' configs) declares
each field once::

    @dataclass
    class DQNConfig:
        learning_rate: float = setting(1e-4, "Adam step size.")

and gets from it everything else: :func:`check_types` refuses a value of the wrong type with
the field named (``learning_rate: expected a float, got 'abc'``; floats must be finite),
:func:`parse_text` turns a command-line string into the field's type, and
:mod:`rlstash.cli.flags` makes the ``--learning-rate`` flag whose ``--help`` is the help
text. Range rules stay in each class's ``__post_init__``, raising :class:`SettingError` (or a
ValueError that names the field).
"""

from __future__ import annotations

import dataclasses
import functools
import math
import types
import typing
from typing import Any

_NONE_WORDS = ("none", "null")
_BOOL_WORDS = {"true": True, "yes": True, "1": True, "false": False, "no": False, "0": False}


class SettingError(ValueError):
    """A setting with a value outside its rule: ``"<name>: expected <rule>, got <value>; <fix>"``.

    ``name`` is the field; the CLI prints it as the flag that sets it."""

    def __init__(self, name: str, expected: str, got: Any, fix: str = "") -> None:
        self.name, self.expected, self.got, self.fix = name, expected, got, fix
        super().__init__(self.text(name))

    def text(self, label: str) -> str:
        """The message with the setting called ``label`` (e.g. ``--learning-rate``)."""
        fix = f"; {self.fix}" if self.fix else ""
        return f"{label}: expected {self.expected}, got {self.got!r}{fix}"


class SettingTypeError(SettingError, TypeError):
    """A setting whose value has the wrong type (a :class:`SettingError` and a TypeError)."""


def setting(default: Any, help: str, **extra: Any) -> Any:
    """A dataclass field with its default and the help text shown for its ``--flag``.
    Lists, dicts and sets become default factories (a fresh copy per instance)."""
    meta = {"help": help, **extra}
    if isinstance(default, (list, dict, set)):
        factory = functools.partial(type(default), default)
        return dataclasses.field(default_factory=factory, metadata=meta)
    return dataclasses.field(default=default, metadata=meta)


def help_of(f: dataclasses.Field) -> str:
    """A field's help text ('' when it has none)."""
    return str(f.metadata.get("help", ""))


@functools.cache
def field_types(cls: type) -> dict[str, Any]:
    """Field name -> resolved type annotation of a settings dataclass."""
    hints = typing.get_type_hints(cls)
    return {f.name: hints[f.name] for f in dataclasses.fields(cls)}


def _args(tp: Any) -> tuple[Any, ...]:
    return typing.get_args(tp)


def _is_union(tp: Any) -> bool:
    return typing.get_origin(tp) in (typing.Union, types.UnionType)


def describe(tp: Any) -> str:
    """'an int', 'a float or None', 'a tuple of ints', ... for error messages and --help."""
    if _is_union(tp):
        return " or ".join(describe(a) for a in _args(tp))
    if tp is type(None):
        return "None"
    origin = typing.get_origin(tp)
    if origin is tuple:
        return f"a list of {describe(_args(tp)[0]).split(' ', 1)[1]}s"
    if origin is dict or tp is dict:
        return "a table of settings"
    names = {int: "an int", float: "a float", bool: "a bool (true/false)", str: "a string"}
    return names.get(tp, getattr(tp, "__name__", str(tp)))


def coerce(name: str, value: Any, tp: Any) -> Any:
    """``value`` as type ``tp`` (ints widen to floats, lists to tuples), or SettingTypeError.
    Floats must be finite (invariant I10: NaN and +-inf are refused for every float setting,
    given in code, on the command line or in a config file)."""
    if _is_union(tp):
        for option in _args(tp):
            try:
                return coerce(name, value, option)
            except SettingTypeError:
                continue
        raise SettingTypeError(name, describe(tp), value)
    if tp is type(None):
        if value is None:
            return None
        raise SettingTypeError(name, "None", value)
    origin = typing.get_origin(tp)
    if origin is tuple:
        if isinstance(value, (list, tuple)):
            item = _args(tp)[0]
            return tuple(coerce(name, v, item) for v in value)
        raise SettingTypeError(name, describe(tp), value)
    if origin is dict or tp is dict:
        if isinstance(value, dict):
            return value
        raise SettingTypeError(name, describe(tp), value)
    if tp is bool:
        if isinstance(value, bool):
            return value
    elif tp is int:
        if isinstance(value, int) and not isinstance(value, bool):
            return value
    elif tp is float:
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            if not math.isfinite(value):
                raise SettingError(name, "a finite number (not NaN or inf)", value, "give a number")
            return float(value)
    elif tp is str:
        if isinstance(value, str):
            return value
    elif tp is Any:
        return value
    raise SettingTypeError(name, describe(tp), value)


def field_values(obj: Any) -> dict[str, Any]:
    """The dataclass instance ``obj``'s values by field name (shallow: the values themselves,
    no copies): the one place where settings are read by name."""
    return {f.name: obj.__dict__[f.name] for f in dataclasses.fields(obj)}


def check_types(obj: Any) -> None:
    """Coerce every field of the dataclass instance ``obj`` to its annotated type in place
    (SettingTypeError naming the first field of the wrong type)."""
    values = field_values(obj)
    for name, tp in field_types(type(obj)).items():
        object.__setattr__(obj, name, coerce(name, values[name], tp))


def parse_text(name: str, text: str, tp: Any) -> Any:
    """A command-line string as a value of type ``tp`` (the parsing rules of the flags):
    ints and floats as Python writes them, bools true/false/yes/no/1/0, None as 'none',
    tuples as '64,64' or '[64, 64]' ('' or '[]' for an empty one)."""
    text = text.strip()
    if _is_union(tp):
        options = _args(tp)
        if type(None) in options and text.lower() in _NONE_WORDS:
            return None
        for option in (o for o in options if o is not type(None)):
            try:
                return parse_text(name, text, option)
            except SettingTypeError:
                continue
        raise SettingTypeError(name, describe(tp), text)
    origin = typing.get_origin(tp)
    try:
        if origin is tuple:
            body = text.strip("[]() ")
            if _args(tp)[0] in (int, float):  # '64x64' for layer widths; keys may hold an x
                body = body.replace("x", ",")
            parts = [p for p in body.split(",") if p.strip()]
            return tuple(parse_text(name, p, _args(tp)[0]) for p in parts)
        if tp is bool:
            return _BOOL_WORDS[text.lower()]
        if tp is int:
            return int(text)
        if tp is float:
            return coerce(name, float(text), float)
        if tp is str:
            return text
    except (KeyError, ValueError) as exc:
        if isinstance(exc, SettingError):
            raise
        raise SettingTypeError(name, describe(tp), text) from None
    raise SettingTypeError(name, describe(tp), text)
