"""The /generate depth contract (server/body.py), on its own terms: how deep a body nests is measured
before parsing, brackets inside strings (escaped quotes and backslashes included) do not count, and the
answer names the top-level field. Checked against a plain character-by-character reference."""

from __future__ import annotations

import json
import random
from typing import Any, Optional

import pytest

from sglang_r3_server.body import MAX_JSON_DEPTH, TooDeep, too_deep

pytestmark = pytest.mark.fast

SEED = 20260524
NASTY = '[]{}"\\:,\u00e9\u2028 \n\t'  # what a string may hold that a naive scan would miscount


def reference_depth(text: str) -> int:
    """Maximum array/object depth of a JSON text, one character at a time."""
    depth = best = 0
    in_string = escaped = False
    for ch in text:
        if in_string:
            if escaped:
                escaped = False
            elif ch == "\\":
                escaped = True
            elif ch == '"':
                in_string = False
        elif ch == '"':
            in_string = True
        elif ch in "[{":
            depth += 1
            best = max(best, depth)
        elif ch in "]}":
            depth -= 1
    return best


def value_depth(v: Any) -> int:
    if isinstance(v, dict):
        return 1 + max((value_depth(x) for x in v.values()), default=0)
    if isinstance(v, list):
        return 1 + max((value_depth(x) for x in v), default=0)
    return 0


def random_string(rng: random.Random) -> str:
    return "".join(rng.choice(NASTY + "ab") for _ in range(rng.randint(0, 12)))


def random_value(rng: random.Random, depth: int) -> Any:
    kind = rng.random()
    if depth <= 0 or kind < 0.3:
        return rng.choice([1, -2.5, True, None, random_string(rng), "\\", '"', "\\\\", '\\"['])
    if kind < 0.65:
        return [random_value(rng, depth - 1) for _ in range(rng.randint(0, 3))]
    return {random_string(rng) + str(i): random_value(rng, depth - 1) for i in range(rng.randint(0, 3))}


def chain(depth: int, leaf: Any = 1) -> Any:
    v = leaf
    for i in range(depth):
        v = [v] if i % 2 else {"k": v}
    return v


def first_too_deep_key(doc: dict, limit: int) -> Optional[str]:
    for k, v in doc.items():
        if 1 + value_depth(v) > limit:
            return k
    return None


def test_random_documents_measure_as_the_reference_does_at_every_limit_around_their_depth():
    rng = random.Random(SEED)
    checked = 0
    for i in range(400):
        doc = {random_string(rng) + f"#{j}": random_value(rng, rng.randint(0, 9)) for j in range(rng.randint(1, 4))}
        if i % 3 == 0:  # a deep member among shallow ones, keys full of brackets and quotes
            doc[f'de"ep[{{\\{i}'] = chain(rng.randint(20, 60), random_string(rng))
        text = json.dumps(doc, ensure_ascii=bool(i % 2))
        d = reference_depth(text)
        assert d == 1 + max((value_depth(v) for v in doc.values()), default=0)  # the reference is right
        body = text.encode()
        for limit in range(max(d - 3, 1), d + 3):  # limit 0: the top-level object itself
            got = too_deep(body, limit)
            if d <= limit:
                assert got is None, (limit, text)
            else:
                assert got == TooDeep(depth=limit + 1, field=first_too_deep_key(doc, limit)), (limit, text)
                checked += 1
    assert checked > 600


def test_brackets_inside_strings_never_count_whatever_the_escapes():
    for s in ["[" * 2000, "\\" * 7 + "[" * 2000, '\\"' + "{" * 2000, "\\\\" + "[" * 2000]:
        body = json.dumps({"text": s, "x": [[1]]}).encode()
        assert too_deep(body, 3) is None
        assert too_deep(body, 2) == TooDeep(depth=3, field="x")


def test_the_stated_limit_and_what_passes_it():
    def body(extra_levels: int) -> bytes:  # the top-level object is level 1
        return b'{"input_ids": [1], "x": ' + b"[" * extra_levels + b"]" * extra_levels + b"}"

    assert too_deep(body(MAX_JSON_DEPTH - 1)) is None
    assert too_deep(body(MAX_JSON_DEPTH)) == TooDeep(depth=MAX_JSON_DEPTH + 1, field="x")
    deep = too_deep(body(100_000))
    assert deep == TooDeep(depth=MAX_JSON_DEPTH + 1, field="x")
    assert f"deeper than {MAX_JSON_DEPTH} levels" in deep.message() and "'x'" in deep.message()
    # Every parser the server may meet reads a body within the limit: stdlib json's recursion limit and
    # orjson's 1024 levels are both well above it.
    json.loads(body(MAX_JSON_DEPTH - 1))


def test_no_field_is_named_where_the_body_is_not_an_object():
    assert too_deep(b"[" * 600 + b"]" * 600) == TooDeep(depth=MAX_JSON_DEPTH + 1, field=None)
    assert too_deep(b'{"a": 1, ' + b"[" * 600) == TooDeep(depth=MAX_JSON_DEPTH + 1, field=None)  # no key before it


def test_malformed_bodies_get_an_answer_without_an_error():
    rng = random.Random(SEED)
    for _ in range(300):
        body = bytes(rng.choice(b'[]{}"\\:,a ') for _ in range(rng.randint(0, 3000)))
        got = too_deep(body, 8)
        assert got is None or (got.depth == 9 and (got.field is None or isinstance(got.field, str)))
