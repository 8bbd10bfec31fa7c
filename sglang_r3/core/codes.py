"""Every code a routing error or an unresolvable handle can carry, in one list each.

The scheduler's capture, the engine's record store, the HTTP layer's schemas and the trainer-side
handles all name their refusals from here, so a code the server can send is one the schema documents
and the client knows.
"""

from __future__ import annotations

# ``meta_info.routing_error.code``: a finished request comes back without a record.
CAPTURE_ERROR_CODES = (
    "missing_rows",  # some of the request's KV slots hold no row a target forward wrote
    "capture_off",  # capture was off when the request finished (the mode is read then, not per forward)
    "image_attention",  # its image's tokens were served with another attention mask than the checkpoint's (Gemma-4)
    # the MTP section was asked for on a PD decode engine: the first round's drafts ran on the prefill engine
    "mtp_drafted_on_prefill",
)
STORE_ERROR_CODES = (  # records by reference: the engine's record store did not take the record
    "store_full",
    "store_unavailable",
    "engine_restarted",  # the engine incarnation that computed it is no longer live
    "duplicate",
)
ROUTING_ERROR_CODES = CAPTURE_ERROR_CODES + STORE_ERROR_CODES

# ``RecordUnavailableError.code``: a handle the trainer cannot resolve into a record.
HANDLE_ERROR_CODES = (
    "engine_restarted", "released", "unknown", "mismatch", "wrong_store", "store_gone",
    "several",  # one fetch, handles refused for different reasons (the message lists each)
)
