"""An independent implementation of the DESIGN §4 prefix hash (Python + the xxhash
module, no MapFlow code), used to produce and to check the golden vectors."""
import struct

import xxhash


def root(block_size: int, ns: str, model: str) -> int:
    data = b"mapflow/v1" + struct.pack("<I", block_size) + ns.encode() + b"\0" + model.encode()
    return xxhash.xxh3_128_intdigest(data)


def step(prev: int, block) -> int:
    le = struct.pack("<QQ", prev & (2**64 - 1), prev >> 64)
    return xxhash.xxh3_128_intdigest(le + struct.pack("<%dI" % len(block), *block))


def prefix(ns: str, model: str, block_size: int, tokens):
    h = root(block_size, ns, model)
    out = []
    for i in range(len(tokens) // block_size):
        h = step(h, tokens[i * block_size:(i + 1) * block_size])
        out.append(h)
    return out


def hexof(h: int) -> str:
    return "%032x" % h


# The golden cases: (namespace, model, B, tokens). Token rules are simple formulas so
# another language can rebuild them.
CASES = [
    ("default", "src-model", 64, [i for i in range(256)]),
    ("", "m", 16, [(i * 2654435761) % 2**32 for i in range(48)]),
    ("tenant-a", "llama-3.1-70b", 128, [50000 + i for i in range(256 + 17)]),
    ("ns/\u00fc", "\u6a21\u578b", 32, [(i * 7) % 50257 for i in range(64)]),
]

if __name__ == "__main__":
    for ns, model, b, toks in CASES:
        print(repr(ns), repr(model), b, len(toks), hexof(root(b, ns, model)),
              [hexof(h) for h in prefix(ns, model, b, toks)])
