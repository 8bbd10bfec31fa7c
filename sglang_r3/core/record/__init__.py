"""Routing records, the one data type that flows from SGLang to the trainer.

``records``: the types (``RoutingRecord``, ``MtpRouting``) and their wire forms; ``bitpack``: the
bit packing of expert ids in the binary form; ``digest``: the token digest that names a sample;
``errors``: ``RecordError``. The public names are re-exported here.
"""

from sglang_r3.core.record.bitpack import bits_for, dtype_for, pack_ids, unpack_ids
from sglang_r3.core.record.digest import token_array, token_digest
from sglang_r3.core.record.errors import RecordError
from sglang_r3.core.record.records import MtpRouting, RoutingRecord

__all__ = ["MtpRouting", "RecordError", "RoutingRecord", "bits_for", "dtype_for", "pack_ids", "token_array",
           "token_digest", "unpack_ids"]
