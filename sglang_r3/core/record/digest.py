"""Token digest: the identity of a sample's full token sequence (prompt + completion).

A row count alone cannot tell two samples of equal length apart; the digest can. The server
digests a Python list per finished request, the trainer a tensor of any integer dtype: both hash
the same little-endian int64 bytes.
"""

from __future__ import annotations

import array
import hashlib
import sys
from typing import Any

import numpy as np

from sglang_r3.core.record.errors import RecordError

def token_digest(token_ids: Any) -> str:
    """Hex blake2b-128 of a sample's full token id sequence (prompt + completion, all T tokens).

    The ids are hashed as little-endian int64 so the server (Python lists) and the trainer (torch
    tensors of any integer dtype) agree byte for byte. A record's ``start`` does not change it: the
    digest names the sample, not the rows.
    """
    return hashlib.blake2b(_token_bytes(token_ids), digest_size=16).hexdigest()


def _token_bytes(token_ids: Any) -> bytes:
    # The scheduler digests a Python list per finished request: array.array packs it in C without
    # numpy's per-element conversion, byte for byte the same int64 (a float or an out-of-range id raises
    # and takes token_array's path, which names it; a list of bools there too, which token_array refuses).
    if type(token_ids) is list and token_ids and type(token_ids[0]) is int:
        try:
            arr = array.array("q", token_ids)
        except (TypeError, OverflowError):
            pass
        else:
            if sys.byteorder != "little":
                arr.byteswap()
            return arr.tobytes()
    return token_array(token_ids).tobytes()


def token_array(token_ids: Any) -> np.ndarray:
    """Token ids (list, numpy array or torch tensor) as 1-D little-endian int64; refuses anything else."""
    if hasattr(token_ids, "detach"):  # torch, possibly on an accelerator
        token_ids = token_ids.detach().cpu().numpy()
    arr = np.asarray(token_ids)
    if arr.ndim != 1:
        raise RecordError(f"token ids must be 1-D, got shape {tuple(arr.shape)}")
    # An empty list comes out float64; anything else non-integer would be silently truncated.
    if arr.size and arr.dtype.kind not in "iu":
        raise RecordError(f"token ids must be integers, got dtype {arr.dtype}")
    return arr.astype("<i8", copy=False)


DIGEST_LEN = 32  # hex chars of a 16-byte blake2b
