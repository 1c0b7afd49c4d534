"""Reading native log lines: decoding that reports bad bytes instead of failing."""


def decode_line(raw: bytes | str) -> tuple[str, str | None]:
    """The line without its terminator, and a description of bad UTF-8 if any."""
    if isinstance(raw, str):
        return raw.rstrip("\r\n"), None
    try:
        return raw.decode("utf-8").rstrip("\r\n"), None
    except UnicodeDecodeError as exc:
        problem = f"invalid UTF-8 byte 0x{raw[exc.start]:02x} at column {exc.start + 1}"
        return raw.decode("utf-8", errors="replace").rstrip("\r\n"), problem
