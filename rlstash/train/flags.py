"""Command-line flags derived from the settings dataclasses (CleanRL style: one source).

Every field of :class:`TrainConfig` and of each registered algorithm's agent config becomes a
``--flag`` (``buffer_size`` -> ``--buffer-size``) whose ``--help`` is the field's help text
with its default, so the flags can never drift from the configs. Values are parsed here, not by
argparse, so that a bad one is one line naming the setting, what was expected, what came and
the fix (:class:`Given`)::

    given = Given.from_args(args)           # the flags that were given, parsed by field type
    cfg = TrainConfig(**given.values)       # SettingError names a field; given.label(...) the flag
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from rlstash.settings import SettingError, SettingTypeError, field_types, help_of, parse_text
from rlstash.train import algos
from rlstash.train.config import LOOP_SETTINGS, TrainConfig, flag

GROUPS = {
    "run": "what to train",
    "collection": "collection",
    "replay": "replay and update schedule (default: the algorithm's, then the env's preset)",
    "learner": "learner placement",
    "output": "evaluation, checkpoints and output",
}
AGENT_DEST = "agent:"  # argparse dest prefix of agent settings


def int_at_least(low: int) -> Callable[[str], int]:
    """An argparse ``type`` for count-like flags (episodes, capacities, env counts): an int
    >= ``low``, else an error that argparse prints as ``--flag: expected an int >= 1, got '0';
    give 1 or more``. Every count flag of the CLI parses through this."""

    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            value = None
        if value is None or value < low:
            raise argparse.ArgumentTypeError(
                f"expected an int >= {low}, got {text!r}; give {low} or more"
            )
        return value

    parse.__name__ = f"int >= {low}"
    return parse


def ints_at_least(low: int, words: tuple[str, ...] = ()) -> Callable[[str], tuple[int | str, ...]]:
    """An argparse ``type``: comma-separated ints >= ``low`` (or one of ``words``), e.g.
    ``0,2,auto``."""
    one = int_at_least(low)

    def parse(text: str) -> tuple[int | str, ...]:
        out: list[int | str] = []
        for part in (p.strip() for p in text.split(",")):
            if part in words:
                out.append(part)
                continue
            try:
                out.append(one(part))
            except argparse.ArgumentTypeError:
                also = f" or {' or '.join(words)}" if words else ""
                raise argparse.ArgumentTypeError(
                    f"expected ints >= {low}{also} joined by ',', got {part!r} in {text!r}; "
                    f"e.g. {low},{low + 2}"
                ) from None
        return tuple(out)

    parse.__name__ = "list"
    return parse


def compute_device(text: str) -> str:
    """An argparse ``type``: a device that computes (cpu, cuda[:N], auto; not meta), checked by
    spelling and type only (:func:`rlstash.device.check_device`: no CUDA call)."""
    from rlstash.device import COMPUTE, check_device

    try:
        check_device(text, "device", COMPUTE)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc).removeprefix("device: ")) from None
    return text


def positive_float(text: str) -> float:
    """An argparse ``type``: a finite float > 0 (a time, a fraction)."""
    try:
        value = float(text)
    except ValueError:
        value = math.nan
    if not 0 < value < math.inf:
        raise argparse.ArgumentTypeError(f"expected a number > 0, got {text!r}; e.g. 1.0")
    return value


def _show(value: Any) -> str:
    if isinstance(value, tuple):
        return ",".join(map(str, value)) if value else "''"
    return repr(value) if isinstance(value, str) else str(value)


def _metavar(tp: Any) -> str:
    text = str(tp)
    if "int" in text and "str" in text:
        return "N|auto"
    for word, meta in (("tuple", "N,N"), ("float", "X"), ("int", "N"), ("str", "TEXT")):
        if word in text:
            return meta
    return "V"


def agent_settings() -> dict[str, list[tuple[str, type]]]:
    """Agent setting name -> [(algo name, config class)] over every registered algorithm."""
    out: dict[str, list[tuple[str, type]]] = {}
    for algo in algos.ALGOS.values():
        for learner in algo.learners.values():
            for name in sorted(algos.agent_fields(learner.config)):
                out.setdefault(name, []).append((algo.name, learner.config))
    return out


def _defaults_text(name: str, owners: list[tuple[str, type]] | None = None) -> str:
    """'[default: dqn 0.0001, sac 0.0003; preset CartPole-v1 (dqn) 0.0023]' for --help."""
    if owners is None:  # a loop setting: each algorithm's default
        parts = [f"{a.name} {_show(a.loop[name])}" for a in algos.ALGOS.values()]
    else:
        by_algo: dict[str, list[str]] = {}
        for algo, cls in owners:
            shown = _show(_default_of(cls, name))
            if shown not in by_algo.setdefault(algo, []):
                by_algo[algo].append(shown)
        parts = [f"{algo} {' or '.join(v)}" for algo, v in by_algo.items()]
    presets = [
        f"{env} ({a.name}) {_show(p[name])}"
        for a in algos.ALGOS.values()
        for env, p in a.presets.items()
        if name in p
    ]
    preset = f"; preset {', '.join(presets)}" if presets else ""
    return f"[default: {', '.join(parts)}{preset}]"


def known_settings() -> list[str]:
    """Every setting name ``--set`` and ``--config`` accept (TrainConfig's and the agents')."""
    return sorted((set(field_types(TrainConfig)) - {"agent"}) | set(agent_settings()))


def setting_type(name: str) -> Any:
    """The type of a TrainConfig field or an agent setting (agent settings share types)."""
    if name in field_types(TrainConfig):
        return field_types(TrainConfig)[name]
    owners = agent_settings().get(name)
    return field_types(owners[0][1])[name] if owners else None


def _add(group: Any, name: str, tp: Any, help: str, dest: str) -> None:
    if tp == bool | str:  # true / false / a word ('auto'): --flag, --flag WORD, --no-flag
        group.add_argument(
            flag(name), dest=dest, nargs="?", const=True, default=argparse.SUPPRESS,
            metavar="true|false|auto", help=help,
        )  # fmt: skip
        group.add_argument(
            "--no-" + flag(name)[2:], dest=dest, action="store_const", const=False,
            default=argparse.SUPPRESS, help=argparse.SUPPRESS,
        )  # fmt: skip
    elif tp is bool:
        group.add_argument(
            flag(name), dest=dest, action=argparse.BooleanOptionalAction,
            default=argparse.SUPPRESS, help=help,
        )  # fmt: skip
    else:
        group.add_argument(
            flag(name), dest=dest, default=argparse.SUPPRESS, metavar=_metavar(tp), help=help
        )


def add_train_flags(parser: argparse.ArgumentParser) -> None:
    """A flag per TrainConfig field (but ``agent``) and per agent setting of every algorithm."""
    groups = {key: parser.add_argument_group(title) for key, title in GROUPS.items()}
    types = field_types(TrainConfig)
    for f in dataclasses.fields(TrainConfig):
        if f.name == "agent":
            continue
        if f.name in LOOP_SETTINGS:
            default = _defaults_text(f.name)
        else:
            default = "" if f.default is None else f"[default: {_show(f.default)}]"
        group = groups[f.metadata.get("group", "run")]
        _add(group, f.name, types[f.name], f"{help_of(f)} {default}", f.name)
    agent = parser.add_argument_group(
        "agent settings (learner only; default: the agent's, then the env's preset "
        "in rlstash.train.algos)"
    )
    for name, owners in sorted(agent_settings().items()):
        helps: dict[str, list[str]] = {}  # help text -> algorithms saying it
        for algo, cls in owners:
            text = help_of({f.name: f for f in dataclasses.fields(cls)}[name])
            if algo not in helps.setdefault(text, []):
                helps[text].append(algo)
        texts = list(helps)
        shown = texts[:1] + [f"({'/'.join(helps[t])}: {t})" for t in texts[1:]]
        help = f"{' '.join(shown)} {_defaults_text(name, owners)}"
        _add(agent, name, field_types(owners[0][1])[name], help, AGENT_DEST + name)


def _default_of(cls: type, name: str) -> Any:
    f = {f.name: f for f in dataclasses.fields(cls)}[name]
    if f.default is not dataclasses.MISSING:
        return f.default
    return f.default_factory()  # type: ignore[misc]


@dataclass
class Given:
    """Settings given on the command line and in a --config file, with where each came from
    (for error messages: ``label(name)``)."""

    values: dict[str, Any] = field(default_factory=dict)
    agent: dict[str, Any] = field(default_factory=dict)
    sources: dict[str, str] = field(default_factory=dict)

    def put(self, name: str, value: Any, source: str) -> None:
        """Record a parsed value of a TrainConfig field or an agent setting."""
        if name in field_types(TrainConfig):
            self.values[name] = value
        else:
            self.agent[name] = value
        self.sources[name] = source

    def put_text(self, name: str, text: str, source: str) -> None:
        """Parse ``text`` by the type of setting ``name`` and record it."""
        tp = setting_type(name)
        if name not in known_settings():
            raise SettingError(
                source, "a known setting", name, f"settings: {', '.join(known_settings())}"
            )
        self.sources[name] = source
        value = parse_text(name, text, tp)
        self.put(name, value, source)

    def config(self) -> TrainConfig:
        """The TrainConfig of what was given (SettingError names a field; see ``explain``)."""
        return TrainConfig(**self.values, agent=dict(self.agent))

    def relabel(self, exc: ValueError) -> str:
        """A plain ``"<setting>: ..."`` error with the setting called by its flag."""
        name, sep, rest = str(exc).partition(": ")
        if sep and name in known_settings():
            return f"{self.sources.get(name, flag(name))}: {rest}"
        return str(exc)

    def explain(self, exc: SettingError) -> str:
        """``exc`` as one line naming the flag (or file entry) that gave the value, and a fix."""
        name = exc.name.removeprefix("agent.")
        if name not in known_settings():
            return str(exc)
        label = self.sources.get(name, flag(name))
        if exc.fix or not isinstance(exc, SettingTypeError):
            return exc.text(label)
        value = _example(name)
        example = _show(value) if value is not None else "1.0"
        fix = f"e.g. {label}={example}" if label.startswith("--set") else f"e.g. {label} {example}"
        if ":" in label:  # a --config file entry: TOML
            fix = f"e.g. {name} = {_toml(value) if value is not None else '1.0'}"
        return SettingError(name, exc.expected, exc.got, fix).text(label)


def _example(name: str) -> Any:
    """A valid value of setting ``name`` (its default; None when it has none)."""
    if name in field_types(TrainConfig):
        f = {f.name: f for f in dataclasses.fields(TrainConfig)}[name]
        value = f.default
        if value is None and name in LOOP_SETTINGS:
            value = next(iter(algos.ALGOS.values())).loop[name]
        if value is None and name == "steps":
            value = algos.DEFAULT_STEPS
        return value
    owners = agent_settings().get(name)
    return _default_of(owners[0][1], name) if owners else None


def _toml(value: Any) -> str:
    """``value`` as a TOML file writes it: ``[64, 64]``, ``"relu"``, ``true``."""
    if isinstance(value, bool):
        return str(value).lower()
    if isinstance(value, str):
        return json.dumps(value)
    if isinstance(value, (tuple, list)):
        return f"[{', '.join(_toml(v) for v in value)}]"
    return repr(value)


def given_flags(args: argparse.Namespace, given: Given) -> Given:
    """Record the TrainConfig and agent flags present in ``args`` (raw text) in ``given``."""
    types = field_types(TrainConfig)
    for dest, raw in vars(args).items():
        name = dest.removeprefix(AGENT_DEST)
        if dest.startswith(AGENT_DEST) or (dest in types and dest != "agent"):
            if isinstance(raw, bool):  # --flag / --no-flag
                given.put(name, raw, flag(name))
            else:
                given.put_text(name, raw, flag(name))
    return given


__all__ = [
    "Given",
    "add_train_flags",
    "agent_settings",
    "compute_device",
    "flag",
    "given_flags",
    "int_at_least",
    "ints_at_least",
    "known_settings",
    "positive_float",
    "setting_type",
]
