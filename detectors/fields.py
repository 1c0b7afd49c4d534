"""Typed access to Kafka-native JSON bodies. Every problem raises
:class:`BadRecord` naming the field path, so a bad record becomes a dead letter
with a reason instead of a crash deep inside a rule."""

from __future__ import annotations

from typing import Any

import orjson

from detectors.envelope import BadRecord, DeadLetterClass

INT16 = (-(2**15), 2**15 - 1)
INT32 = (-(2**31), 2**31 - 1)
INT64 = (-(2**63), 2**63 - 1)


def json_object(text: str, what: str) -> dict[str, Any]:
    """``text`` as a JSON object; raise :class:`BadRecord` naming ``what`` if it is not one."""
    try:
        value = orjson.loads(text)
    except orjson.JSONDecodeError as exc:
        raise BadRecord(f"malformed {what} JSON: {exc}", DeadLetterClass.MALFORMED_JSON) from None
    if not isinstance(value, dict):
        raise BadRecord(
            f"{what} must be a JSON object, got {type(value).__name__}", DeadLetterClass.WRONG_TYPE
        )
    return value


def get_int(obj: dict[str, Any], key: str, path: str, *, bounds=INT32, default: Any = ...) -> int:
    """``obj[key]`` as a Kafka integer of the given width; ``default`` if absent
    (tagged or defaulted fields) or BadRecord if required."""
    value = obj.get(key, ...)  # JSON has no Ellipsis: it marks an absent key
    if type(value) is int and bounds[0] <= value <= bounds[1]:
        return value  # the everyday case, settled in one test
    if value is ...:
        if default is ...:
            raise BadRecord(f"missing field {path}.{key}", DeadLetterClass.MISSING_FIELD)
        return int(default)
    if isinstance(value, bool) or not isinstance(value, int):
        raise BadRecord(
            f"{path}.{key} must be an integer, got {type(value).__name__}", DeadLetterClass.WRONG_TYPE
        )
    if not bounds[0] <= value <= bounds[1]:
        raise BadRecord(
            f"{path}.{key} = {value} is out of range for its Kafka type", DeadLetterClass.OUT_OF_RANGE
        )
    return value


def get_str(obj: dict[str, Any], key: str, path: str, *, default: Any = ...) -> str | None:
    value = obj.get(key)
    if value is None:
        if default is ...:
            raise BadRecord(f"missing field {path}.{key}", DeadLetterClass.MISSING_FIELD)
        return default  # type: ignore[no-any-return]
    if not isinstance(value, str):
        raise BadRecord(
            f"{path}.{key} must be a string, got {type(value).__name__}", DeadLetterClass.WRONG_TYPE
        )
    return value


def get_bool(obj: dict[str, Any], key: str, path: str, *, default: bool) -> bool:
    value = obj.get(key, default)
    if not isinstance(value, bool):
        raise BadRecord(
            f"{path}.{key} must be a boolean, got {type(value).__name__}", DeadLetterClass.WRONG_TYPE
        )
    return value


def get_list(obj: dict[str, Any], key: str, path: str, *, default: Any = ...) -> list[Any]:
    value = obj.get(key)
    if value is None:
        if default is ...:
            raise BadRecord(f"missing field {path}.{key}", DeadLetterClass.MISSING_FIELD)
        return default  # type: ignore[no-any-return]
    if not isinstance(value, list):
        raise BadRecord(
            f"{path}.{key} must be a list, got {type(value).__name__}", DeadLetterClass.WRONG_TYPE
        )
    return value


def get_obj(obj: dict[str, Any], key: str, path: str, *, default: Any = ...) -> dict[str, Any]:
    value = obj.get(key)
    if value is None:
        if default is ...:
            raise BadRecord(f"missing field {path}.{key}", DeadLetterClass.MISSING_FIELD)
        return default  # type: ignore[no-any-return]
    if not isinstance(value, dict):
        raise BadRecord(
            f"{path}.{key} must be an object, got {type(value).__name__}", DeadLetterClass.WRONG_TYPE
        )
    return value


class Item:
    """The path of a list entry, rendered only when an error message needs it:
    extraction walks millions of entries and almost never fails."""

    __slots__ = ("index", "parent")

    def __init__(self, parent: object, index: int):
        self.parent = parent
        self.index = index

    def __str__(self) -> str:
        return f"{self.parent}[{self.index}]"

    __format__ = lambda self, spec: str(self)  # noqa: E731 - f-strings render it lazily too


def objects(items: list[Any], path: object) -> list[tuple[Any, dict[str, Any]]]:
    """The list's entries with their paths, each required to be a JSON object."""
    out = []
    for i, item in enumerate(items):
        if type(item) is not dict:
            raise BadRecord(
                f"{path}[{i}] must be an object, got {type(item).__name__}", DeadLetterClass.WRONG_TYPE
            )
        out.append((Item(path, i), item))
    return out


def int_list(items: list[Any], path: str) -> tuple[int, ...]:
    for i, item in enumerate(items):
        if isinstance(item, bool) or not isinstance(item, int) or not INT32[0] <= item <= INT32[1]:
            raise BadRecord(
                f"{path}[{i}] must be a broker id (int32), got {item!r}", DeadLetterClass.of_bad_number(item)
            )
    return tuple(items)
