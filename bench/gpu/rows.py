"""Map rows (proto/mf_row.h layout) built in NumPy for the GPU benchmark.

patterns() draws per-head block patterns that look like real ones: the sink block 0,
a local window ending at the diagonal, and a few per-head vertical stripes, scaled to a
target density of the causal blocks. row_prefix() writes everything of row i up to the
tiles (header, model, tokens, cols, col_off, head_mask, masses); the caller fills scales
and tiles and calls seal() for the xxh3-64 checksum (python3-xxhash)."""
import struct

import numpy as np

MASK, FP16, BF16, FP8, U8LOG = 0, 1, 2, 3, 4
MAGIC, VERSION, HEADER = 0x57524D46, 1, 80


def align16(x):
    return (x + 15) & ~15


def patterns(rng, heads, nb, density):
    """keep[h, i, j] (bool, j <= i): sink + window + stripes at about `density`."""
    keep = np.zeros((heads, nb, nb), dtype=bool)
    i = np.arange(nb)[:, None]
    j = np.arange(nb)[None, :]
    causal = j <= i
    for h in range(heads):
        # window of ~60% of the budget, stripes ~40%: each row keeps ≈ density·(i+1)
        win = np.maximum(1, np.round(0.6 * density * (i + 1))).astype(int)
        k = (j > i - win) & causal
        n_str = max(1, int(round(0.4 * density * nb)))
        stripes = rng.choice(nb, size=min(nb, n_str), replace=False)
        k[:, stripes] |= causal[:, stripes]
        k[:, 0] = True
        k[np.arange(nb), np.arange(nb)] = True
        keep[h] = k & causal
    return keep


def head_masks(keep, i):
    """(cols, masks) of row i: union over heads, u64 head bit masks."""
    heads = keep.shape[0]
    bits = np.zeros(i + 1, dtype=np.uint64)
    for h in range(heads):
        bits |= keep[h, i, :i + 1].astype(np.uint64) << np.uint64(h)
    cols = np.nonzero(bits)[0].astype(np.uint32)
    return cols, bits[cols]


def layout(codec, b, n_cols, e, model_len):
    off = HEADER
    lay = {"model": off}
    off = align16(off + model_len)
    lay["tokens"] = off
    off = align16(off + 4 * b)
    lay["cols"] = off
    off = align16(off + 4 * n_cols)
    lay["col_off"] = off
    off = align16(off + 4 * n_cols)
    lay["head_mask"] = off
    off = align16(off + 8 * n_cols)
    lay["mass"] = off
    off = align16(off + e)
    lay["scales"] = off
    if codec in (FP8, U8LOG):
        off = align16(off + 4 * e)
    elem = 0 if codec == MASK else 2 if codec in (FP16, BF16) else 1
    lay["tile_bytes"] = b * b * elem
    lay["tiles"] = off
    lay["total"] = off + e * lay["tile_bytes"]
    lay["entries"] = e
    return lay


def popcount64(x):
    x = x.astype(np.uint64)
    c = np.zeros(x.shape, dtype=np.uint64)
    for s in range(64):
        c += (x >> np.uint64(s)) & np.uint64(1)
    return c


def row_prefix(keep, i, codec, b, layer=0, model=b"src", rng=None):
    """Bytes [0, tiles) of row i, and its layout."""
    heads = keep.shape[0]
    cols, masks = head_masks(keep, i)
    pc = popcount64(masks)
    e = int(pc.sum())
    col_off = np.concatenate([[0], np.cumsum(pc)[:-1]]).astype(np.uint32)
    lay = layout(codec, b, len(cols), e, len(model))
    buf = bytearray(lay["tiles"])
    struct.pack_into("<IHBBQIIIHHIIfI", buf, 0, MAGIC, VERSION, codec, len(model), 0,
                     lay["total"], layer, i, b, heads, len(cols), e, 0.9, 0)
    # parent / hash left zero: the kernels never read them
    buf[lay["model"]:lay["model"] + len(model)] = model
    buf[lay["tokens"]:lay["tokens"] + 4 * b] = np.arange(i * b, (i + 1) * b,
                                                         dtype=np.uint32).tobytes()
    buf[lay["cols"]:lay["cols"] + 4 * len(cols)] = cols.tobytes()
    buf[lay["col_off"]:lay["col_off"] + 4 * len(cols)] = col_off.tobytes()
    buf[lay["head_mask"]:lay["head_mask"] + 8 * len(cols)] = masks.astype(np.uint64).tobytes()
    g = rng if rng is not None else np.random.default_rng(i)
    buf[lay["mass"]:lay["mass"] + e] = g.integers(1, 256, e, dtype=np.uint8).tobytes()
    return bytes(buf), lay


def seal(row):
    """Writes the xxh3-64 checksum (field at byte 8, hashed as zero) into a uint8 array."""
    import xxhash
    row[8:16] = 0
    h = xxhash.xxh3_64_intdigest(row.tobytes())
    row[8:16] = np.frombuffer(struct.pack("<Q", h), dtype=np.uint8)
