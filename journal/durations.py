"""Durations, typed one way everywhere: a `timedelta`, a number of seconds, or a string
such as "500ms", "30s", "15m", "12h" or "7d".

Every duration setting (`JournalSettings`, `QuerySettings`, `ProjectionSettings`,
`RetentionPolicy.keep`, ...) and the CLI's `--keep` go through this one parser, so
what one accepts the others accept. A bad value is an `InvalidSettings` naming the
field (`InvalidArgument` from `parse_duration` itself). Pure: no I/O.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Sequence
from datetime import timedelta
from typing import Any, TypeAlias

import attrs

from journal.errors import InvalidArgument, InvalidSettings

Duration: TypeAlias = timedelta | float | int | str
"""What a duration setting accepts: a timedelta, seconds, or "500ms" / "30s" / "15m" /
"12h" / "7d"."""

_DURATION = re.compile(r"^([0-9]{1,9})(ms|s|m|h|d)$")
_UNITS = {"ms": "milliseconds", "s": "seconds", "m": "minutes", "h": "hours", "d": "days"}
EXPECTED = "a duration such as 500ms, 30s, 15m, 12h or 7d"


def _parse(text: object) -> timedelta | None:
    match = _DURATION.match(text.strip()) if isinstance(text, str) else None
    return None if match is None else timedelta(**{_UNITS[match[2]]: int(match[1])})


def format_duration(value: timedelta) -> str:
    """The duration as `parse_duration` reads it, in its largest exact unit ("7d",
    "90m", "500ms"); `str(value)` where it cannot (zero or less, a fraction of a
    millisecond, or more digits than the parser takes)."""
    micros = (value.days * 86_400 + value.seconds) * 1_000_000 + value.microseconds
    for unit, size in (("d", 86_400_000_000), ("h", 3_600_000_000), ("m", 60_000_000),
                       ("s", 1_000_000), ("ms", 1_000)):  # fmt: skip
        if micros > 0 and micros % size == 0:
            text = f"{micros // size}{unit}"
            return text if _parse(text) == value else str(value)
    return str(value)


def parse_duration(text: str) -> timedelta:
    """`500ms`, `30s`, `15m`, `12h`, `7d` -> a positive timedelta; `InvalidArgument`
    otherwise (zero, a sign, a fraction, another unit)."""
    value = _parse(text)
    if value is None or value <= timedelta(0):
        raise InvalidArgument(f"expected a positive {EXPECTED.removeprefix('a ')}, got {text!r}")
    return value


def to_timedelta(value: Duration) -> timedelta:
    """A timedelta, seconds (int or float) or a duration string -> a timedelta;
    `InvalidSettings` otherwise. Signs are the settings' validators' business."""
    if isinstance(value, timedelta):
        return value
    if isinstance(value, str):
        parsed = _parse(value)
        if parsed is None:
            raise InvalidSettings(f"expected {EXPECTED}, got {value!r}")
        return parsed
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise InvalidSettings(
            f"expected a timedelta, seconds or {EXPECTED}, got {type(value).__name__}"
        )
    try:
        return timedelta(seconds=value)
    except (OverflowError, ValueError) as e:  # inf, nan, beyond timedelta's range
        raise InvalidSettings(f"expected a finite number of seconds, got {value!r}") from e


def to_optional_timedelta(value: Duration | None) -> timedelta | None:
    """`to_timedelta`, with None kept (a duration that can be off)."""
    return None if value is None else to_timedelta(value)


def _naming(name: str, convert: Callable[[Any], Any]) -> Callable[[Any], Any]:
    def converter(value: Any) -> Any:
        try:
            return convert(value)
        except InvalidSettings as e:
            raise InvalidSettings(f"{name}: {e}") from None

    return converter


def name_duration_fields(
    cls: type, fields: Sequence[attrs.Attribute[Any]]
) -> list[attrs.Attribute[Any]]:
    """An attrs `field_transformer`: a duration field's conversion error names the field
    (`time_window: expected a duration such as ...`). The fields are declared with
    `converter=to_timedelta` (or `to_optional_timedelta`) so that type checkers see
    what `__init__` accepts."""
    ours: tuple[object, ...] = (to_timedelta, to_optional_timedelta)
    out = []
    for field in fields:
        convert: Any = field.converter
        if convert in ours:
            field = field.evolve(converter=_naming(field.name, convert))
        out.append(field)
    return out


def non_negative(instance: Any, attribute: attrs.Attribute[Any], value: timedelta | None) -> None:
    """A validator: the duration is zero or more (None passes: off)."""
    if value is not None and value < timedelta(0):
        raise InvalidSettings(f"{attribute.name} must not be negative, got {value}")


def positive(instance: Any, attribute: attrs.Attribute[Any], value: timedelta | None) -> None:
    """A validator: the duration is more than zero (None passes: off)."""
    if value is not None and value <= timedelta(0):
        raise InvalidSettings(f"{attribute.name} must be positive, got {value}")
