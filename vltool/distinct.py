"""Whether a column's values are all distinct, in 8 bytes of memory per row.

Arrow's `count_distinct` builds a hash table of every value: at 10M string ids it took 0.7 GB that its
memory pool kept for the rest of the run, more than a pretrain run's whole start-up needs. Here each value
is hashed to 64 bits in numpy (SLICE_ROWS rows at a time, reading the Arrow buffers in place), the hashes are
sorted, and only the rows whose hash repeats are compared exactly (their values, by Arrow). A collision of
two different values costs a comparison, never a wrong answer: `count_distinct` decides every suspect.
"""

from __future__ import annotations

import numpy as np

# pyarrow is imported inside the functions: vltool.io and vltool.checks import this module, and `vltool
# --help` loads them, so a module-level pyarrow would slow every command's start.

SLICE_ROWS = 1 << 18  # rows hashed per step: bounds the transient memory (their bytes, a few arrays of that many rows)

_M1 = np.uint64(0x9E3779B97F4A7C15)  # odd multipliers of the mix (golden ratio; murmur3's fmix64 constants)
_M2 = np.uint64(0xFF51AFD7ED558CCD)
_M3 = np.uint64(0xC4CEB9FE1A85EC53)


def _fmix(h: np.ndarray) -> np.ndarray:
    """murmur3's 64-bit finaliser, in place: every input bit reaches every output bit."""
    h ^= h >> np.uint64(33)
    h *= _M2
    h ^= h >> np.uint64(33)
    h *= _M3
    h ^= h >> np.uint64(33)
    return h


def _binary_parts(arr):
    """(offsets (n + 1,) int64 into data, data (bytes,) uint8) of a string or binary array."""
    import pyarrow as pa  # (lazy: see the top)

    if not (pa.types.is_string(arr.type) or pa.types.is_binary(arr.type)
            or pa.types.is_large_string(arr.type) or pa.types.is_large_binary(arr.type)):
        arr = arr.cast(pa.large_binary())
    wide = pa.types.is_large_string(arr.type) or pa.types.is_large_binary(arr.type)
    _, off_buf, data_buf = arr.buffers()
    offsets = np.frombuffer(off_buf, dtype=np.int64 if wide else np.int32)[arr.offset: arr.offset + len(arr) + 1]
    data = np.frombuffer(data_buf, dtype=np.uint8) if data_buf is not None else np.zeros(0, np.uint8)
    return offsets.astype(np.int64), data


def _hash_strings(arr) -> np.ndarray:
    """(n,) uint64 hash of each value's bytes and length (a null hashes as an empty value): the bytes are read
    eight at a time, as unaligned little-endian words of the data buffer."""
    offsets, data = _binary_parts(arr)
    starts, lens = offsets[:-1], np.diff(offsets)  # (n,) each
    lo = int(starts[0]) if len(starts) else 0
    hi = int(offsets[-1]) if len(offsets) else 0
    padded = np.zeros(hi - lo + 8, np.uint8)  # the slice's bytes, then 8 zero bytes: a word may start at the last byte
    padded[: hi - lo] = data[lo:hi]
    words = np.ndarray((hi - lo + 1,), dtype="<u8", buffer=padded, strides=(1,))  # (bytes + 1,) the word at each byte
    starts = starts - lo
    h = _fmix(lens.astype(np.uint64) * _M1 + _M2)  # (n,)
    for j in range(0, int(lens.max()) if len(lens) else 0, 8):
        live = np.flatnonzero(lens > j) if lens.min() <= j else slice(None)  # rows with bytes from j on
        w = words[starts[live] + j]
        left = lens[live] - j  # (live,) bytes of this row from j on; a word past the end keeps only those
        short = np.flatnonzero(left < 8)
        if len(short):
            w[short] &= (np.uint64(1) << (left[short].astype(np.uint64) * np.uint64(8))) - np.uint64(1)
        x = (h[live] ^ w) * _M1
        h[live] = x ^ (x >> np.uint64(29))
    return _fmix(h)


def string_hashes(column) -> np.ndarray:
    """(rows,) uint64: a hash of each value of a string (or binary) column; equal values hash equal."""
    import pyarrow as pa  # (lazy: see the top)

    if not isinstance(column, pa.ChunkedArray):
        column = pa.chunked_array([column])
    out = np.empty(len(column), np.uint64)
    for a in range(0, len(column), SLICE_ROWS):
        part = column.slice(a, SLICE_ROWS).combine_chunks()  # (a saved image dataset has a record batch per 100 rows)
        out[a: a + len(part)] = _hash_strings(part)
    return out


def duplicate(column) -> tuple[bool, object]:
    """(True, a value that occurs more than once) or (False, None). Memory: 8 bytes per row, plus the rows
    whose hashes repeat (none in practice: a pair of different values shares a hash about once in 2^64)."""
    import pyarrow as pa  # (lazy: see the top)

    if not isinstance(column, pa.ChunkedArray):
        column = pa.chunked_array([column])
    if not _hashable(column.type):
        return _exact_duplicate(column)
    h = string_hashes(column)
    h.sort()  # in place: no second copy
    same = h[1:] == h[:-1]
    if not same.any():
        return False, None
    suspects = np.unique(h[1:][same])
    del h, same
    rows = [np.flatnonzero(np.isin(string_hashes(column.slice(a, SLICE_ROWS)), suspects)) + a
            for a in range(0, len(column), SLICE_ROWS)]
    return _exact_duplicate(column.take(pa.array(np.concatenate(rows))))


def duplicate_reference(column) -> tuple[bool, object]:
    """`duplicate` by Arrow's hash table of every value (the tests' reference)."""
    import pyarrow as pa  # (lazy: see the top)

    return _exact_duplicate(column if isinstance(column, pa.ChunkedArray) else pa.chunked_array([column]))


def _hashable(t) -> bool:
    import pyarrow as pa  # (lazy: see the top)

    return any(f(t) for f in (pa.types.is_string, pa.types.is_large_string, pa.types.is_binary, pa.types.is_large_binary))


def _exact_duplicate(values) -> tuple[bool, object]:
    import pyarrow.compute as pc  # (lazy: see the top)

    if pc.count_distinct(values, mode="all").as_py() == len(values):
        return False, None
    counts = pc.value_counts(values)
    return True, counts.field("values").filter(pc.greater(counts.field("counts"), 1))[0].as_py()
