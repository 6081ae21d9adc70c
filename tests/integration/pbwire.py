"""Protobuf wire encoding by hand (varint, tag, length-delimited), so the shell tests can
write MappingProfile bytes without protoc bindings; one copy for every test that needs it."""


def v(n):
    """A varint."""
    out = b""
    while True:
        b = n & 0x7f
        n >>= 7
        out += bytes([b | (0x80 if n else 0)])
        if not n:
            return out


def f(num, wt, payload):
    """Field num with wire type wt, payload already encoded."""
    return v(num << 3 | wt) + payload


def s(num, b):
    """A length-delimited field (bytes, string, sub-message)."""
    return f(num, 2, v(len(b)) + b)
