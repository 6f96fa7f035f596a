"""Validation of typed config dataclasses against their annotations (torch-free).

Every config object in attnlab (`TransformerConfig`, `OptimConfig`, the data specs) is a dataclass whose
`__post_init__` calls :func:`check_fields`. Values arriving from Hydra are coerced where that is lossless
(an OmegaConf list becomes a tuple, an integral float stays a float; a mapping's keys and values are
checked as its annotation says) and rejected with a message naming the field, the value and the accepted
values otherwise.
"""

from __future__ import annotations

import dataclasses
import difflib
import inspect
import operator
import types
import typing
from collections.abc import Mapping
from typing import Any, Literal, Union, get_args, get_origin


def _describe(tp: Any) -> str:
    origin = get_origin(tp)
    if origin is Literal:
        return " | ".join(repr(a) for a in get_args(tp))
    if origin in (Union, types.UnionType):
        return " | ".join(_describe(a) for a in get_args(tp))
    if tp is type(None):
        return "null"
    if origin is tuple:
        return "[" + ", ".join(_describe(a) for a in get_args(tp) if a is not Ellipsis) + "]"
    if origin is dict:
        return "{" + ": ".join(_describe(a) for a in get_args(tp)) + "}"
    return getattr(tp, "__name__", str(tp))


def _coerce(value: Any, tp: Any) -> tuple[bool, Any]:
    """Return (ok, coerced value) for `value` against annotation `tp`."""
    origin = get_origin(tp)
    if origin is Literal:
        return (value in get_args(tp) and type(value) in {type(a) for a in get_args(tp)}), value
    if origin in (Union, types.UnionType):
        for arg in get_args(tp):
            ok, coerced = _coerce(value, arg)
            if ok:
                return True, coerced
        return False, value
    if tp is type(None):
        return value is None, value
    if tp is bool:
        return isinstance(value, bool), value
    if tp is int:
        return is_int(value), value
    if tp is float:
        if is_number(value):
            try:
                return True, float(value)
            except OverflowError:  # an int past a float's range (about 1.8e308)
                return False, value
        return False, value
    if tp is str:
        return isinstance(value, str), value
    if origin is tuple:
        if isinstance(value, (str, bytes)) or not hasattr(value, "__iter__"):
            return False, value
        items = list(value)
        args = get_args(tp)
        if len(args) == 2 and args[1] is Ellipsis:
            args = (args[0],) * len(items)
        if len(items) != len(args):
            return False, value
        out = []
        for item, arg in zip(items, args, strict=True):
            ok, coerced = _coerce(item, arg)
            if not ok:
                return False, value
            out.append(coerced)
        return True, tuple(out)
    if origin is dict:
        return _coerce_dict(value, tp)
    return True, value


def _coerce_dict(value: Any, tp: Any) -> tuple[bool, Any]:
    """`_coerce` for a `dict[K, V]` annotation: a mapping whose every key is a K and value a V."""
    if not isinstance(value, Mapping):
        return False, value
    key_tp, value_tp = get_args(tp)
    out = {}
    for key, item in value.items():
        key_ok, key = _coerce(key, key_tp)
        item_ok, item = _coerce(item, value_tp)
        if not (key_ok and item_ok):
            return False, value
        out[key] = item
    return True, out


def shown(value: Any, most: int = 48) -> str:
    """`repr(value)` for an error message, its middle elided past `most` characters (an integer of 400
    digits in a damaged file reads as its first and last digits and its length)."""
    text = repr(value)
    if len(text) <= most:
        return text
    return f"{text[: most // 2]}…{text[-8:]} ({len(text)} characters)"


# What a refused true or false was typed as: YAML (a config file, OmegaConf's dotlist) reads these words
# unquoted as booleans, so `decode.print_alignment=yes` arrives as True
_YAML_BOOLEANS = {
    True: " (YAML reads an unquoted yes, on or true as the boolean true)",
    False: " (YAML reads an unquoted no, off or false as the boolean false)",
}


def check_fields(obj: Any) -> None:
    """Check (and coerce in place) every field of dataclass `obj` against its type annotation.

    Raises:
        ValueError: naming the field, the bad value and what is accepted; a true or false a field does
            not take says that YAML read the value as one (`yes`, `on`, `no`, `off` as typed).
    """
    hints = typing.get_type_hints(type(obj))
    for field in dataclasses.fields(obj):
        value = getattr(obj, field.name)
        ok, coerced = _coerce(value, hints[field.name])
        if not ok:
            raise ValueError(
                f"{field.name}={shown(value)} is not valid: expected {_describe(hints[field.name])}"
                f"{_YAML_BOOLEANS[value] if isinstance(value, bool) else ''}"
            )
        object.__setattr__(obj, field.name, coerced)


def require(condition: bool, message: str) -> None:
    """Raise `ValueError(message)` unless `condition` holds."""
    if not condition:
        raise ValueError(message)


def require_positive(obj: Any, *names: str) -> None:
    """Every named field of `obj` must be > 0."""
    for name in names:
        value = getattr(obj, name)
        require(value > 0, f"{name}={value!r} must be positive")


def require_probability(obj: Any, *names: str) -> None:
    """Every named field of `obj` must lie in [0, 1)."""
    for name in names:
        value = getattr(obj, name)
        require(0.0 <= value < 1.0, f"{name}={value!r} must be in [0, 1)")


RESERVED_KEYS = {"_target_", "_partial_", "_recursive_", "_convert_", "_args_"}


class ConfigError(ValueError):
    """A configuration value is wrong; the message names the key and what to do."""


def is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def check_chunk_lines(chunk_lines: Any) -> int:
    """`chunk_lines`, the lines read and decoded at a time (`Translator.stream`, attnlab-translate's
    `chunk_lines=`), as an int when it is a whole number of lines >= 1: an integer (an int, a NumPy integer:
    `operator.index` takes it; a bool or a whole float is not one).

    Raises:
        TypeError: It is no integer; the message names the setting and its value.
        ValueError: It is < 1; likewise.
    """
    refused = f"chunk_lines={chunk_lines!r} must be a whole number of lines >= 1 (an int)"
    try:
        count = None if isinstance(chunk_lines, bool) else operator.index(chunk_lines)
    except TypeError:
        count = None
    if count is None:
        raise TypeError(refused)
    if count < 1:
        raise ValueError(refused)
    return count


def is_number(value: Any) -> bool:
    """Whether `value` is an int or a float (True and False are not, though Python counts them)."""
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def whole_count(value: Any) -> int | None:
    """`value` as an int when it is a whole number >= 1: an int, or a whole float (YAML's `1e2` is 100.0),
    which Lightning takes as the int; None for anything else (a bool, a fraction, infinity, text)."""
    if is_int(value):
        return value if value >= 1 else None
    if isinstance(value, float) and value >= 1 and value.is_integer():
        return int(value)
    return None


def did_you_mean(name: str, known: list[str], prefix: str = "", suffix: str = "") -> str:
    """`did you mean <prefix><closest known name><suffix>? ` for a mistyped key, or "" when none is close."""
    close = difflib.get_close_matches(name, known, n=1)
    return f"did you mean {prefix}{close[0]}{suffix}? " if close else ""


def reject_unknown_keys(key: str, cls: type, given: Any, known: list[str]) -> None:
    unknown = sorted(set(given) - set(known) - RESERVED_KEYS)
    if unknown:
        raise ConfigError(
            f"{key}.{unknown[0]} is not a parameter of {cls.__module__}.{cls.__qualname__}; "
            f"{did_you_mean(unknown[0], known, f'{key}.')}known keys: {', '.join(known)}"
        )


def build_from(cls: type, kwargs: dict[str, Any], key: str) -> Any:
    """`cls(**kwargs)` for a class attnlab chose (never one named by the values), turning unknown keys and
    bad values into a `ConfigError` naming `key`."""
    known = (
        [f.name for f in dataclasses.fields(cls)]
        if dataclasses.is_dataclass(cls)
        else list(inspect.signature(cls).parameters)
    )
    reject_unknown_keys(key, cls, kwargs, known)
    try:
        return cls(**kwargs)
    except (ValueError, TypeError) as exc:
        raise ConfigError(f"{key}.{exc}") from exc


PLACEHOLDER_LANGS = ("src", "tgt")  # `data=files` suffixes of corpora named train.src / train.tgt


def language_subtag(value: Any) -> str | None:
    """The language subtag of a language code (`de_DE`, `en-US`, `DE` -> de, en, de); None for anything
    that is not one (the placeholders `src` and `tgt`, `source`, a column name)."""
    if not isinstance(value, str):
        return None
    primary = value.replace("-", "_").split("_")[0].lower()
    plain = primary.isascii() and primary.isalpha() and 2 <= len(primary) <= 3
    return primary if plain and primary not in PLACEHOLDER_LANGS else None
