"""A decoded Kafka message as Kafka's generated ``*JsonConverter.write`` prints it.

Kafka's message generator (``generator/.../JsonConverterGenerator.java``)
writes, in schema order, every field present at the message's version, named
in lowerCamelCase; a tagged field only when it differs from its default.
Values: numbers and booleans as JSON numbers and booleans, ``uuid`` as
``Uuid.toString()`` (URL-safe base64 without padding), ``bytes`` as Jackson's
``BinaryNode`` (standard base64), arrays and structs as JSON arrays and
objects, null as null. ``kafka-dump-log.sh --cluster-metadata-decoder`` prints
metadata records this way (``MetadataJsonConverters.writeJson``), and so does
the request log.

The walk follows the schema (kafka-python's ``ApiData.json``, the schema file
as loaded, common structs resolved) and reads the values kafka-python decoded,
whose attribute names are the schema names in snake case.
"""

from __future__ import annotations

import base64
import uuid
from collections.abc import Callable
from functools import lru_cache
from typing import Any

from kafka.protocol.schemas import BaseField

_INTEGERS = ("int8", "int16", "int32", "int64", "uint16")
ZERO_UUID = uuid.UUID(int=0)
Convert = Callable[[Any], Any]


@lru_cache(maxsize=1 << 16)  # topic and directory ids repeat across a log's records
def kafka_uuid(value: uuid.UUID | None) -> str:
    """``org.apache.kafka.common.Uuid.toString()``: 22 URL-safe base64 characters."""
    raw = (value or ZERO_UUID).bytes
    return base64.urlsafe_b64encode(raw).rstrip(b"=").decode("ascii")


def _bytes(value: Any) -> str | None:
    return None if value is None else base64.b64encode(bytes(value)).decode("ascii")


def _same(value: Any) -> Any:
    return value


def _in(versions: str | None, version: int) -> bool:
    bounds = BaseField.parse_versions(versions)
    return bounds is not None and bounds[0] <= version <= bounds[1]


def _default(spec: dict[str, Any]) -> Any:
    """The field's default as the JSON value Kafka would print for it."""
    kind, text = spec["type"], str(spec.get("default", ""))
    if text == "null":
        return None
    if kind.startswith("[]"):
        return []
    if kind in _INTEGERS:
        return int(text, 0) if text else 0
    if kind == "float64":
        return float(text) if text else 0.0
    if kind == "bool":
        return text.lower() == "true"
    if kind == "uuid":
        return kafka_uuid(None)
    if kind in ("string", "bytes"):
        return text
    return None  # a struct: never tagged in the schemas read here


def _array(item: Convert) -> Convert:
    return lambda value: None if value is None else [item(v) for v in value]


def _converter(spec: dict[str, Any], version: int) -> Convert:
    """What turns a decoded value of field ``spec`` into Kafka's JSON value."""
    kind = spec["type"]
    if "fields" in spec:  # a struct, or an array of structs
        struct = object_converter(spec["fields"], version)
        if kind.startswith("[]"):
            return _array(struct)
        return lambda value: None if value is None else struct(value)
    element = kind.removeprefix("[]")
    item = kafka_uuid if element == "uuid" else _bytes if element == "bytes" else _same
    if kind.startswith("[]"):
        return _array(item) if item is not _same else _same  # kafka-python gives a fresh list
    return item


_CONVERTERS: dict[tuple[int, int], Convert] = {}


def object_converter(fields: list[dict[str, Any]], version: int) -> Convert:
    """What turns a message (or struct) decoded at ``version``, whose schema
    fields are ``fields``, into its JSON object. Built once per schema and
    version (keyed by the fields' identity: the schemas are loaded once, at
    import, and live as long as the process)."""
    key = (id(fields), version)
    convert = _CONVERTERS.get(key)
    if convert is not None:
        return convert
    plan = []
    for spec in fields:
        if not _in(spec.get("versions"), version):
            continue
        name = spec["name"]
        tagged = "tag" in spec and _in(spec.get("taggedVersions"), version)
        plan.append(
            (
                name[0].lower() + name[1:],
                BaseField.underscore_name(name),
                _converter(spec, version),
                tagged,
                _default(spec),
            )
        )

    def convert_object(message: Any) -> dict[str, Any]:
        out: dict[str, Any] = {}
        for json_name, attribute, value_of, tagged, default in plan:
            value = value_of(getattr(message, attribute))
            if tagged and value == default:
                continue
            out[json_name] = value
        return out

    _CONVERTERS[key] = convert_object
    return convert_object


def message_json(fields: list[dict[str, Any]], message: Any, version: int) -> dict[str, Any]:
    """The JSON object of ``message`` (decoded at ``version``) whose schema fields are ``fields``."""
    result: dict[str, Any] = object_converter(fields, version)(message)
    return result
