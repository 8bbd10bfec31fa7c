"""Bit packing of expert ids for the binary wire form: ``bits_for(num_experts)`` bits per id
(7 bits for 128 experts instead of 8), a big-endian bit stream zero-padded to a byte."""

from __future__ import annotations

import numpy as np

from sglang_r3.core.record.errors import RecordError


def dtype_for(num_experts: int) -> str:
    return "uint8" if num_experts <= 256 else "uint16"


def bits_for(num_experts: int) -> int:
    """Bits that hold every id of ``num_experts`` experts: ceil(log2(num_experts)), at least 1."""
    return max(1, (int(num_experts) - 1).bit_length())


def pack_ids(ids: np.ndarray, bits: int) -> bytes:
    """Row-major ids (uint8/uint16) as a big-endian bit stream, ``bits`` per id, zero-padded to a byte."""
    flat = np.ascontiguousarray(ids).reshape(-1)
    width = 8 * flat.dtype.itemsize
    if flat.dtype.kind != "u" or not 1 <= bits <= width:
        raise RecordError(f"cannot pack {flat.dtype} ids at {bits} bits")
    if flat.size and int(flat.max()) >> bits:
        raise RecordError(f"expert id {int(flat.max())} does not fit in {bits} bits")
    if bits == width:
        return flat.astype(flat.dtype.newbyteorder(">"), copy=False).tobytes()
    if bits < 8:
        return _pack_groups(flat, bits)
    # Flat unpack/pack (no per-row axis loops): [n, width] bit matrix, keep the low `bits` columns.
    big = flat.astype(flat.dtype.newbyteorder(">"), copy=False).view(np.uint8)
    bitmat = np.unpackbits(big).reshape(flat.size, width)[:, width - bits :]
    return np.packbits(bitmat.reshape(-1)).tobytes()


# Ids per block of the grouped packer (8 ids of b < 8 bits are exactly b bytes): blocks of 1M ids
# keep each column's temporaries cache-sized.
_GROUP_BLOCK = 1 << 20
# Groups (64-bit words) per block of the unpacker: 32K words (256 KiB per temporary) stay in cache.
_SPREAD_BLOCK = 1 << 15


def _pack_groups(flat: np.ndarray, bits: int) -> bytes:
    """pack_ids for bits < 8: every 8 ids fill exactly ``bits`` bytes; id j lands in bytes (k, k+1) at
    k = j*bits // 8, placed there with one 16-bit shift (the same stream as the bit matrix, no bit matrix)."""
    n = flat.size
    groups = -(-n // 8)
    ids = flat
    if n < groups * 8:  # the last group's missing ids are zero bits
        ids = np.zeros(groups * 8, dtype=flat.dtype)
        ids[:n] = flat
    ids = ids.reshape(groups, 8)
    out = np.zeros((groups, bits + 1), dtype=np.uint8)  # +1: spill column of the last id, always 0
    step = _GROUP_BLOCK // 8
    v = np.empty(min(groups, step), dtype=np.uint16)
    for g0 in range(0, groups, step):
        g1 = min(groups, g0 + step)
        vv = v[: g1 - g0]
        for j in range(8):
            k, off = divmod(j * bits, 8)
            np.left_shift(ids[g0:g1, j], 16 - off - bits, out=vv, dtype=np.uint16)
            out[g0:g1, k] |= (vv >> 8).astype(np.uint8)
            out[g0:g1, k + 1] |= (vv & 0xFF).astype(np.uint8)
    return out[:, :bits].reshape(-1)[: (n * bits + 7) // 8].tobytes()


def unpack_ids(raw: bytes, count: int, bits: int, dtype, field: str = "experts") -> np.ndarray:
    """Inverse of ``pack_ids``: ``count`` ids of ``bits`` bits -> flat array of ``dtype``."""
    dt = np.dtype(dtype)
    width = 8 * dt.itemsize
    if not 1 <= bits <= width:
        raise RecordError(f"routing field {field!r}: packing.bits={bits} does not fit {dt}")
    need = (count * bits + 7) // 8
    if len(raw) != need:
        raise RecordError(f"routing field {field!r}: {len(raw)} bytes, expected {need} for {count} ids at {bits} bits")
    src = np.frombuffer(raw, dtype=np.uint8)
    if bits == width:
        return src.view(dt.newbyteorder(">")).astype(dt)
    if bits < 8:
        return _unpack_groups(src, count, bits).astype(dt, copy=False)
    bitmat = np.zeros((count, width), dtype=np.uint8)
    bitmat[:, width - bits :] = np.unpackbits(src, count=count * bits).reshape(count, bits)
    return np.packbits(bitmat.reshape(-1)).view(dt.newbyteorder(">")).astype(dt)


def _unpack_groups(src: np.ndarray, count: int, bits: int) -> np.ndarray:
    """unpack_ids for bits < 8: every ``bits`` bytes hold 8 ids. Each group is read as one big-endian
    64-bit word (the window runs into the next group; those bytes are shifted out) and its 8 fields are
    spread to the 8 bytes of the word in three mask-and-shift steps (halves, quarters, ids), so every pass
    is a whole-word operation on a cache-sized block; stored big-endian, id 0 lands in the first byte."""
    groups = -(-count // 8)
    inside = min(groups, (src.size - 8) // bits + 1) if src.size >= 8 else 0  # windows within src
    out = np.empty(groups, dtype=">u8")
    step = min(max(groups, 1), _SPREAD_BLOCK)
    x, t = np.empty(step, dtype=np.uint64), np.empty(step, dtype=np.uint64)
    u = np.uint64
    half, quarter = 4 * bits, 2 * bits
    m1 = u((1 << half) - 1)
    m2 = u(((1 << quarter) - 1) * (1 | 1 << 32))
    m3 = u(((1 << bits) - 1) * (1 | 1 << 16 | 1 << 32 | 1 << 48))

    def spread(words: np.ndarray, dst: np.ndarray) -> None:
        xx, tt = x[: words.shape[0]], t[: words.shape[0]]
        np.copyto(xx, words)
        xx >>= u(64 - 8 * bits)  # the group's 8*bits data bits at the bottom, id 7 lowest
        for mask, width, lane in ((m1, half, 32), (m2, quarter, 16), (m3, bits, 8)):
            np.bitwise_and(xx, mask << u(width), out=tt)
            xx &= mask
            tt <<= u(lane - width)
            xx |= tt
        np.copyto(dst, xx)

    def windows(buf: np.ndarray, n: int) -> np.ndarray:
        return np.lib.stride_tricks.as_strided(np.frombuffer(buf, dtype=">u8", count=1), shape=(n,), strides=(bits,))

    if inside:
        words, head = windows(src, inside), out[:inside]
        for g0 in range(0, inside, step):
            spread(words[g0 : g0 + step], head[g0 : g0 + step])
    if inside < groups:  # the last groups' windows would read past src: read them from a padded copy
        rest = src[inside * bits :]
        tail = np.zeros((groups - inside) * bits + 8, dtype=np.uint8)
        tail[: rest.size] = rest
        spread(windows(tail, groups - inside), out[inside:])
    return out.view(np.uint8)[:count]

