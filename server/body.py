"""How deep a JSON body may nest, decided by us before any parser sees it: parsers' own limits differ
by release (stdlib ~1000, orjson 3.8 none, 3.13 1024), and a client's answer must not depend on which
one was installed. The scan is linear and vectorized; a shallow body costs two ``bytes.count`` calls.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Optional

import numpy as np

MAX_JSON_DEPTH = 512

_QUOTE, _BACKSLASH = ord('"'), ord("\\")
_LBRACKET, _RBRACKET, _LBRACE, _RBRACE = (ord(c) for c in "[]{}")


@dataclass(frozen=True)
class TooDeep:
    depth: int  # the depth reached at the point the limit was passed (at least limit + 1)
    field: Optional[str]  # the top-level key whose value nests too deep, when the body is an object

    def message(self, limit: int = MAX_JSON_DEPTH) -> str:
        where = f" in field {self.field!r}" if self.field is not None else ""
        return (f"request body nests deeper than {limit} levels of arrays/objects{where}; "
                f"the limit is {limit} (MAX_JSON_DEPTH)")


def too_deep(body: bytes, limit: int = MAX_JSON_DEPTH) -> Optional[TooDeep]:
    """None when ``body`` (JSON text) never nests deeper than ``limit``, else where it does.

    Brackets inside strings do not count. A body that is not valid JSON (an unterminated string, say)
    gets some answer here and is refused by the parser afterwards; the scan itself never fails on it.
    """
    if body.count(b"[") + body.count(b"{") <= limit:  # brackets in strings only overcount
        return None
    a = np.frombuffer(body, np.uint8)
    quotes = np.flatnonzero(a == _QUOTE)
    if quotes.size:
        # A quote is escaped when an odd run of backslashes stands right before it.
        slashes = np.flatnonzero(a == _BACKSLASH)
        run = np.zeros(quotes.size, np.int64)
        if slashes.size:
            # first position of each run of consecutive backslashes, for every backslash
            starts = np.ones(slashes.size, bool)
            starts[1:] = np.diff(slashes) != 1
            run_start = slashes[np.flatnonzero(starts)[np.cumsum(starts) - 1]]
            k = np.searchsorted(slashes, quotes) - 1  # the last backslash before each quote
            ends_here = (k >= 0) & (slashes[np.maximum(k, 0)] == quotes - 1)
            run = np.where(ends_here, quotes - run_start[np.maximum(k, 0)], 0)
        quotes = quotes[run % 2 == 0]
    opens = (a == _LBRACKET) | (a == _LBRACE)
    brackets = np.flatnonzero(opens | (a == _RBRACKET) | (a == _RBRACE))
    # Outside a string exactly when an even number of unescaped quotes precede the bracket.
    brackets = brackets[np.searchsorted(quotes, brackets) % 2 == 0]
    step = np.where(opens[brackets], 1, -1)
    depth = np.cumsum(step)
    over = np.flatnonzero(depth > limit)
    if not over.size:
        return None
    first = int(over[0])
    return TooDeep(depth=int(depth[first]), field=_top_level_key(body, quotes, brackets, depth, first))


def _top_level_key(body: bytes, quotes, brackets, depth, first: int) -> Optional[str]:
    """The key of the top-level object member whose value holds bracket ``first``, if there is one."""
    if body.lstrip()[:1] != b"{":
        return None
    # The member's value opened at the last bracket before ``first`` that took the depth from 1 to 2.
    opened = np.flatnonzero(depth[:first + 1] == 2)
    opened = opened[(opened == 0) | (depth[np.maximum(opened - 1, 0)] == 1)]
    if not opened.size:
        return None
    at = int(brackets[opened[-1]])
    before = quotes[quotes < at]
    if before.size < 2 or body[int(before[-1]) + 1:at].strip() != b":":
        return None
    try:
        key = json.loads(body[int(before[-2]):int(before[-1]) + 1])
    except ValueError:
        return None
    return key if isinstance(key, str) else None
