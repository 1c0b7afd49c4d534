"""Kafka messages decoded from their bytes straight to the JSON Kafka prints for them.

The input is a message in Kafka's serialization at a flexible version (every
metadata record and KRaft control record is flexible from version 0):
integers big-endian, ``bool`` one byte, ``float64`` eight (IEEE 754),
``uuid`` 16 bytes, strings, ``bytes`` and arrays compact (an unsigned varint
of length + 1, 0 for null), and every struct, the message included, ending
in its tagged-field section (an unsigned varint count, then per field its
tag, its size and its bytes). That is Kafka's generated ``*Data.read``
(``generator/.../MessageDataGenerator.java``, ``ByteBufferAccessor``).

The output is what Kafka's generated ``*JsonConverter.write``
(``JsonConverterGenerator.java``) writes, as ``kafka-dump-log.sh
--cluster-metadata-decoder`` prints metadata records
(``MetadataJsonConverters.writeJson``): in schema order, every field present
at the message's version, named in lowerCamelCase; a tagged field only when
it differs from its default; ``uuid`` as ``Uuid.toString()`` (URL-safe
base64 without padding); ``bytes`` as standard base64 with padding (Jackson's
``BinaryNode``); ``float64`` as a number; arrays and structs as JSON arrays and objects; null
as null.

Why a decoder of our own and not kafka-python's: kafka-python's generated
decoder (``compiled_decode_from``) builds a ``uuid.UUID`` object for every
uuid and a data object for every message and struct, and that object then had
to be walked a second time, field by field by attribute name, into Kafka's
JSON form. A large cluster's snapshot is about a million PartitionRecords,
each with a topic id and three directory ids, and those three steps held
decoding to 16,000-27,000 records per second on one core, a third of what a
snapshot of that size must load at (issue 24: 50,000). This module compiles,
once per schema and version, one Python function per message and struct, from
source generated out of the schema: each field read in place with
``struct.Struct.unpack_from`` (consecutive fixed-width fields by one call),
compact lengths with a one-byte fast path, and the values put straight into
the JSON object; uuids are encoded from their 16 bytes (memoised, as topic and
directory ids repeat), and no intermediate object exists. (A first version
with a closure per field instead of generated source reached 26,000 on the
same benchmark: the calls cost what the objects had.) The source is built
from the vendored schema files only. kafka-python still reads the record batches
(their header, CRC and compression: ``producers.record_batch``) and loads the schemas (``load_json``, common
structs resolved); the test fixtures encode records with kafka-python's
message classes, so every test decodes bytes this module did not write.
"""

from __future__ import annotations

import base64
import struct
from collections.abc import Callable
from functools import lru_cache
from typing import Any

from kafka.protocol.schemas import BaseField

Reader = Callable[[bytes, int], tuple[Any, int]]

# Fixed-width field types: struct format characters (big-endian; float64 is
# an IEEE 754 double, ``ByteBufferAccessor.readDouble``).
_FIXED = {"int8": "b", "int16": "h", "int32": "i", "int64": "q", "uint16": "H", "bool": "?", "float64": "d"}
_INTEGERS = ("int8", "int16", "int32", "int64", "uint16")
_ARRAY_ITEMS = {*_FIXED, "uuid", "string"}
# Arrays of fixed-width items up to this length are read with a prepared Struct.
_PREPARED_ITEMS = 64


@lru_cache(maxsize=1 << 16)  # topic and directory ids repeat across a log's records
def uuid_text(raw: bytes) -> str:
    """``org.apache.kafka.common.Uuid.toString()`` of a uuid's 16 bytes:
    22 URL-safe base64 characters."""
    return base64.urlsafe_b64encode(raw).rstrip(b"=").decode("ascii")


ZERO_UUID = uuid_text(bytes(16))


def bytes_text(raw: bytes) -> str:
    """A ``bytes`` field as Jackson writes the ``BinaryNode`` the JSON
    converter makes of it: standard base64 with padding."""
    return base64.b64encode(raw).decode("ascii")


@lru_cache(maxsize=1 << 16)
def uuid_texts(raw: bytes) -> tuple[str, ...]:
    """:func:`uuid_text` of each 16 bytes of ``raw`` (a uuid array's items)."""
    return tuple(uuid_text(raw[at : at + 16]) for at in range(0, len(raw), 16))


def uvarint(data: bytes, pos: int) -> tuple[int, int]:
    """An unsigned varint (``ByteUtils.readUnsignedVarint``: at most 5 bytes)
    at ``pos``, and where it ended."""
    byte = data[pos]
    if byte < 0x80:
        return byte, pos + 1
    value = byte & 0x7F
    for shift in (7, 14, 21, 28):
        pos += 1
        byte = data[pos]
        value |= (byte & 0x7F) << shift
        if byte < 0x80:
            return value, pos + 1
    raise ValueError("unsigned varint longer than 5 bytes")


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
    if kind == "bool":
        return text.lower() == "true"
    if kind == "uuid":
        return ZERO_UUID
    if kind == "string":
        return text
    raise ValueError(f"field {spec['name']}: a tagged {kind} has no default here")


def _json_name(spec: dict[str, Any]) -> str:
    name: str = spec["name"]
    return name[0].lower() + name[1:]


def struct_decoder(fields: list[dict[str, Any]], version: int, name: str) -> Reader:
    """The reader of a message (or struct) ``name`` at a flexible ``version``
    whose schema fields are ``fields``: from a position, its JSON object and
    where it ended. Compiled anew on each call: call it once per schema and
    version (producers.metadata_records does, at import)."""
    return _Source(version).struct(fields, name)


class _Source:
    """The generated source of one reader, and the constants it refers to."""

    def __init__(self, version: int) -> None:
        self.version = version
        self.lines: list[str] = []
        self.names: dict[str, Any] = {
            "_uvarint": uvarint,
            "_uuid": uuid_text,
            "_uuids": uuid_texts,
            "_bytes": bytes_text,
            "_Struct": struct.Struct,
        }

    def constant(self, value: Any) -> str:
        name = f"_c{len(self.names)}"
        self.names[name] = value
        return name

    def emit(self, indent: int, line: str) -> None:
        self.lines.append("    " * indent + line)

    def function(self, name: str) -> Reader:
        code = "\n".join(self.lines) + "\n"
        exec(compile(code, f"<fencewatch decoder {name} v{self.version}>", "exec"), self.names)
        reader: Reader = self.names["decode"]
        return reader

    def struct(self, fields: list[dict[str, Any]], name: str) -> Reader:
        """Reads the fields present at the version, in order, then the tagged-field section."""
        version = self.version
        present = [spec for spec in fields if _in(spec.get("versions"), version)]
        order = [_json_name(spec) for spec in present]
        untagged = []
        # tag -> (JSON name, reader, default): Kafka's JSON omits a tagged field at its default.
        # A "tag" may be written as a string ("0"): Kafka's generator reads it as the number.
        tagged: dict[int, tuple[str, Reader, Any]] = {}
        for spec in present:
            if "tag" in spec and _in(spec.get("taggedVersions"), version):
                tagged[int(spec["tag"])] = (_json_name(spec), _Source(version).value(spec), _default(spec))
            else:
                untagged.append(spec)
        self.emit(0, "def decode(data, pos):")
        group: list[tuple[str, str]] = []  # consecutive fixed-width fields: (variable, format)
        for index, spec in enumerate(untagged):
            code = _FIXED.get(spec["type"])
            if code is not None:
                group.append((f"v{index}", code))
                continue
            self._fixed(group)
            group = []
            self._read(spec, f"v{index}", 1)
        self._fixed(group)
        items = ", ".join(f"{_json_name(spec)!r}: v{index}" for index, spec in enumerate(untagged))
        self.emit(1, f"out = {{{items}}}")
        self.emit(1, "if data[pos] == 0:  # no tagged fields: nearly every struct")
        self.emit(2, "return out, pos + 1")
        self.emit(1, f"return {self.constant(_tagged_fields(tagged, order))}(data, pos, out)")
        return self.function(name)

    def value(self, spec: dict[str, Any]) -> Reader:
        """Reads one value of ``spec`` (a tagged field's)."""
        self.emit(0, "def decode(data, pos):")
        if spec["type"] in _FIXED:
            self._fixed([("v", _FIXED[spec["type"]])])
        else:
            self._read(spec, "v", 1)
        self.emit(1, "return v, pos")
        return self.function(spec["name"])

    def _fixed(self, group: list[tuple[str, str]]) -> None:
        if not group:
            return
        layout = struct.Struct(">" + "".join(code for _, code in group))
        targets = ", ".join(variable for variable, _ in group)
        self.emit(1, f"{targets}, = {self.constant(layout.unpack_from)}(data, pos)")
        self.emit(1, f"pos += {layout.size}")

    def _length(self, spec: dict[str, Any], variable: str, indent: int) -> None:
        """A compact length (length + 1; 0 for null) into ``n_<variable>``; a null
        value of a non-nullable field is refused, as Kafka's reader refuses it
        ("non-nullable field ... was serialized as null")."""
        n = f"n_{variable}"
        self.emit(indent, f"{n} = data[pos]")
        self.emit(indent, f"if {n} < 0x80:")
        self.emit(indent + 1, "pos += 1")
        self.emit(indent, "else:")
        self.emit(indent + 1, f"{n}, pos = _uvarint(data, pos)")
        self.emit(indent, f"{n} -= 1")
        self.emit(indent, f"if {n} < 0:")
        if _in(spec.get("nullableVersions"), self.version):
            self.emit(indent + 1, f"{variable} = None")
        else:
            message = f"non-nullable field {spec['name']} was serialized as null"
            self.emit(indent + 1, f"raise ValueError({message!r})")

    def _read(self, spec: dict[str, Any], variable: str, indent: int) -> None:
        """Code that reads a value of ``spec`` at ``pos`` into ``variable`` and moves ``pos`` past it."""
        name, kind = spec["name"], spec["type"]
        n = f"n_{variable}"
        if "fields" in spec and not kind.startswith("[]"):
            if _in(spec.get("nullableVersions"), self.version):
                raise ValueError(f"field {name}: nullable structs are not read here")
            decoder = self.constant(struct_decoder(spec["fields"], self.version, name))
            self.emit(indent, f"{variable}, pos = {decoder}(data, pos)")
            return
        if kind == "uuid":
            self.emit(indent, f"{variable} = _uuid(data[pos:pos + 16])")
            self.emit(indent, "pos += 16")
            return
        element = kind.removeprefix("[]")
        is_array_of_known = kind != element and element in _ARRAY_ITEMS
        if kind not in ("string", "bytes") and "fields" not in spec and not is_array_of_known:
            raise ValueError(f"field {name}: type {kind} is not read here")
        self._length(spec, variable, indent)
        self.emit(indent, "else:")
        body = indent + 1
        if kind == "string":
            self.emit(body, f"{variable} = data[pos:pos + {n}].decode('utf-8')")
            self.emit(body, f"pos += {n}")
        elif kind == "bytes":
            self.emit(body, f"{variable} = _bytes(data[pos:pos + {n}])")
            self.emit(body, f"pos += {n}")
        elif kind == "[]uuid":
            # One look-up for the whole array: a partition's directories repeat as a set.
            self.emit(body, f"{variable} = list(_uuids(data[pos:pos + 16 * {n}]))")
            self.emit(body, f"pos += 16 * {n}")
        elif "fields" in spec or kind == "[]string":
            if "fields" in spec:
                item = self.constant(struct_decoder(spec["fields"], self.version, name))
            else:
                item = self.constant(_Source(self.version).value({"name": name, "type": "string"}))
            self.emit(body, f"{variable} = []")
            self.emit(body, f"for _ in range({n}):")
            self.emit(body + 1, f"item, pos = {item}(data, pos)")
            self.emit(body + 1, f"{variable}.append(item)")
        else:
            code = _FIXED[kind[2:]]
            size = struct.calcsize(">" + code)
            prepared = self.constant(
                [struct.Struct(f">{k}{code}").unpack_from for k in range(_PREPARED_ITEMS)]
            )
            self.emit(body, f"if {n} < {_PREPARED_ITEMS}:")
            self.emit(body + 1, f"{variable} = list({prepared}[{n}](data, pos))")
            self.emit(body, "else:")
            self.emit(
                body + 1, f"{variable} = list(_Struct('>' + str({n}) + {code!r}).unpack_from(data, pos))"
            )
            self.emit(body, f"pos += {size} * {n}")


def _tagged_fields(
    tagged: dict[int, tuple[str, Reader, Any]], order: list[str]
) -> Callable[[bytes, int, dict[str, Any]], tuple[dict[str, Any], int]]:
    """Reads a tagged-field section into ``out``, which it returns in schema order."""

    def read(data: bytes, pos: int, out: dict[str, Any]) -> tuple[dict[str, Any], int]:
        count, pos = uvarint(data, pos)
        for _ in range(count):
            tag, pos = uvarint(data, pos)
            size, pos = uvarint(data, pos)
            end = pos + size
            field = tagged.get(tag)
            if field is not None:  # an unknown tag is skipped, as Kafka keeps it unread
                name, read_value, default = field
                value, at = read_value(data, pos)
                if at != end:
                    raise ValueError(f"tagged field {name} is {at - pos} bytes, its size says {size}")
                if value != default:
                    out[name] = value
            pos = end
        return {name: out[name] for name in order if name in out}, pos

    return read
