"""How a release's arrays are stored: one .npz document (numpy's zip of .npy arrays), not JSON text.

A float64 takes 8 bytes stored (JSON took ~20 for a noisy value, and the driver and the API held several
copies of the text). Each array is deflated only where that pays: when a deflated sample of its bytes is at
most COMPRESS_IF of the raw sample (LDA's post-processing zeroes about half of its values, deflated to
~48%; noisy dense values deflate to ~90%, not worth a decompression on every read). Any numpy reads a
stored document with `np.load(io.BytesIO(blob))`.
"""

from __future__ import annotations

import io
import json
import zipfile
import zlib
from collections.abc import Iterator, Mapping

import numpy as np
from numpy.typing import ArrayLike

#: Deflate an array when a sample of it deflates to at most this fraction of its bytes.
COMPRESS_IF = 0.75
#: Bytes of each array deflated to decide (the whole array when smaller).
SAMPLE_BYTES = 1 << 16
#: Deflate level: 1 is ~3x faster than zlib's default for the same ratio on these arrays.
DEFLATE_LEVEL = 1
#: Values per piece of JSON text when a stored array is streamed to a client (~350 kB of text).
JSON_PIECE_VALUES = 1 << 14


def _pays(sample: bytes) -> bool:
    return len(sample) > 0 and len(zlib.compress(sample, DEFLATE_LEVEL)) <= COMPRESS_IF * len(sample)


#: Per stored block at most: its .npy header (128 bytes for shapes of up to 4 dimensions below 10^9) and
#: its zip entries (local and central headers, zip64 extras), plus twice its file name; then the zip's end.
BLOCK_OVERHEAD_BYTES = 256
END_BYTES = 22


def stored_bound(arrays: Mapping[str, ArrayLike]) -> int:
    """The most bytes `encode_arrays(arrays)` takes, from the arrays' names and shapes alone (never their
    values, which decide only whether a block is deflated): 8 bytes per value and the headers."""
    total = END_BYTES
    for name, value in arrays.items():
        total += 8 * int(np.size(value)) + BLOCK_OVERHEAD_BYTES + 2 * len(f"{name}.npy".encode())
    return total


def encode_arrays(arrays: Mapping[str, ArrayLike]) -> bytes:
    """The .npz bytes of `arrays` (float64, little-endian), each member deflated where it pays."""
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w", allowZip64=True) as archive:
        for name, value in arrays.items():
            array = np.asarray(value, dtype="<f8")
            member = zipfile.ZipInfo(f"{name}.npy", date_time=(1980, 1, 1, 0, 0, 0))
            if _pays(array.ravel()[: SAMPLE_BYTES // array.itemsize].tobytes()):
                member.compress_type = zipfile.ZIP_DEFLATED
                member._compresslevel = DEFLATE_LEVEL  # type: ignore[attr-defined]  # zipfile has no public way
            with archive.open(member, "w", force_zip64=array.nbytes > (1 << 31)) as out:
                np.lib.format.write_array(out, array, allow_pickle=False)
    return buffer.getvalue()


def decode_arrays(blob: bytes) -> dict[str, np.ndarray]:
    """The arrays of a stored release, by block name, in their stored order."""
    with np.load(io.BytesIO(blob), allow_pickle=False) as stored:
        return {name: stored[name] for name in stored.files}


def array_json(array: np.ndarray) -> Iterator[str]:
    """The JSON text of `array` as nested lists (what `json.dumps(array.tolist())` writes), in pieces of at
    most about JSON_PIECE_VALUES values, so a large array is never one string in memory."""
    if array.size <= JSON_PIECE_VALUES:
        yield json.dumps(array.tolist(), allow_nan=False)
        return
    if array.ndim == 1:
        yield "["
        for start in range(0, array.shape[0], JSON_PIECE_VALUES):
            piece = json.dumps(array[start : start + JSON_PIECE_VALUES].tolist(), allow_nan=False)[1:-1]
            yield piece if start == 0 else ", " + piece
        yield "]"
        return
    yield "["
    for index in range(array.shape[0]):
        if index:
            yield ", "
        yield from array_json(array[index])
    yield "]"


def coalesced(pieces: Iterator[str], size: int = 1 << 16) -> Iterator[str]:
    """`pieces` joined into chunks of at least `size` characters (the last may be shorter): each chunk a
    server sends costs a hop between threads, so thousands of small pieces must not each be one."""
    buffer: list[str] = []
    length = 0
    for piece in pieces:
        buffer.append(piece)
        length += len(piece)
        if length >= size:
            yield "".join(buffer)
            buffer, length = [], 0
    if buffer:
        yield "".join(buffer)
