"""The small handle a response carries instead of a routing record, and the errors of resolving one.

Plain data (JSON through HTTP and the gateway), Ray-free: it names a record (store, engine, incarnation,
request id) and repeats its identity fields, so a trainer checks a sample before fetching and the store
refuses a record that does not match.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any, Mapping, Optional

from sglang_r3.core import settings
from sglang_r3.core.codes import HANDLE_ERROR_CODES
from sglang_r3.core.record import RecordError

NAMESPACE = settings.DEFAULT_NAMESPACE  # Ray namespace of every fleet's named actors


class RecordUnavailableError(RecordError):
    """A handle that cannot be resolved: its engine incarnation died, it was fetched, expired, or
    the store is gone. ``code`` is one of ``codes.HANDLE_ERROR_CODES``; the message names the engine and request."""

    def __init__(self, code: str, message: str):
        if code not in HANDLE_ERROR_CODES:
            raise ValueError(f"{code!r} is not one of {HANDLE_ERROR_CODES}")
        super().__init__(message)
        self.code = code


@dataclass(frozen=True)
class RecordHandle:
    store: str  # Ray actor name of the engine's record store (in `namespace`)
    namespace: str
    engine: str  # engine id, unique per fleet ("<fleet>-e<i>")
    incarnation: int  # restart generation of that engine; a restart makes every older handle fail
    rid: str  # SGLang request id (meta_info.id)
    start: int
    num_tokens: int
    weight_version: Optional[str] = None
    tokens_digest: Optional[str] = None

    def to_wire(self) -> dict:
        return asdict(self)

    @classmethod
    def from_wire(cls, d: Any) -> "RecordHandle":
        if isinstance(d, RecordHandle):
            return d
        if isinstance(d, Mapping) and "routing_ref" in d:  # a whole meta_info
            d = d["routing_ref"]
        if isinstance(d, Mapping) and isinstance(d.get("meta_info"), Mapping):  # a whole /generate output
            return cls.from_wire(d["meta_info"])
        if not isinstance(d, Mapping):
            raise RecordError(f"a routing handle must be an object, got {type(d).__name__}")
        try:
            return cls(
                store=str(d["store"]), namespace=str(d["namespace"]), engine=str(d["engine"]),
                incarnation=int(d["incarnation"]), rid=str(d["rid"]), start=int(d["start"]),
                num_tokens=int(d["num_tokens"]),
                weight_version=None if d.get("weight_version") is None else str(d["weight_version"]),
                tokens_digest=None if d.get("tokens_digest") is None else str(d["tokens_digest"]),
            )
        except KeyError as e:
            raise RecordError(f"routing handle is missing field {e}") from None
        except (TypeError, ValueError) as e:
            raise RecordError(f"routing handle has a field of the wrong type: {e}") from None

    def describe(self) -> str:
        return f"request {self.rid} of engine {self.engine} (incarnation {self.incarnation})"
