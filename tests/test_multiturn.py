"""Multi-turn / partial rollouts: records of one sample's turns join into the record of the whole sequence.

The oracle is SGLang itself: the final sequence served again in one request (cache flushed, rows from
token 0) must give exactly the joined rows.
"""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from sglang_r3.dev.embedded import EMBEDDED_CONFIG
from sglang_r3.core.layout import ModelLayout, layout_from_hf_config
from sglang_r3.core.record import RecordError
from sglang_r3.trainer import check_records
from sglang_r3.trainer.join import RecordPart, join_records
from tests.support.routing_http import flush_cache, full_ids, greedy, record_of

pytestmark = [pytest.mark.server, pytest.mark.release]

# Byte-level tokenizer: id == byte, and ids 1..250 are plain tokens.
TURN1 = list(b"User: name three primes.\nAssistant:")
TURN2_USER = list(b"\nUser: and two more?\nAssistant:")
TURN3_USER = list(b"\nUser: thanks.\nAssistant:")


@pytest.fixture(scope="module")
def url(nospec_server):
    return nospec_server


@pytest.fixture(scope="module")
def layout() -> ModelLayout:
    # The trainer's side of the check: the layout of the model config it trains, not the server's word.
    return layout_from_hf_config(EMBEDDED_CONFIG)


def _turn(url, prompt, routing_start=None, max_new_tokens=10):
    extra = {} if routing_start is None else {"routing_start": routing_start}
    out = greedy(url, max_new_tokens, input_ids=prompt, return_routing=True, **extra)
    return out, RecordPart(record_of(out), full_ids(out, prompt))


@pytest.fixture(scope="module")
def conversation(url):
    """Three real turns of one sample; turns 2 and 3 ask only for the rows the previous turn lacks."""
    flush_cache(url)
    parts, outs = [], []
    prompt = TURN1
    for new in (None, TURN2_USER, TURN3_USER):
        start = None
        if new is not None:
            prev = parts[-1].tokens
            prompt = list(prev) + new
            start = len(prev) - 1  # the previous turn's last token was never an input there
        out, part = _turn(url, prompt, start)
        outs.append(out)
        parts.append(part)
    return outs, parts


def test_later_turns_hit_the_prefix_cache_and_return_only_new_rows(conversation):
    outs, parts = conversation
    for prev, out, part in zip(parts, outs[1:], parts[1:]):
        assert out["meta_info"]["cached_tokens"] > 0
        assert part.record.start == len(prev.tokens) - 1
        assert part.record.num_tokens == len(part.tokens) - len(prev.tokens)


def test_joined_turns_equal_the_whole_sequence_served_at_once(url, layout, conversation):
    _, parts = conversation
    joined = join_records(parts)
    final = list(parts[-1].tokens)
    flush_cache(url)
    oracle = greedy(url, 1, input_ids=final, return_routing=True)
    assert oracle["meta_info"]["cached_tokens"] == 0
    rows = record_of(oracle).experts[: len(final) - 1]  # the oracle also routed `final`'s last token
    assert joined.record.start == 0
    np.testing.assert_array_equal(joined.record.experts, rows)
    np.testing.assert_array_equal(joined.tokens, final)
    assert check_records([joined.record], [joined.tokens], layout) == [len(final)]


def test_joined_record_carries_the_final_sequences_digest_and_one_version(conversation):
    _, parts = conversation
    joined = join_records(parts)
    assert joined.record.tokens_digest == parts[-1].record.tokens_digest
    assert [(s.row_start, s.row_stop) for s in joined.segments] == [
        (p.record.start, p.record.start + p.record.num_tokens) for p in parts
    ]
    assert len(set(joined.weight_versions)) == 1
    assert joined.record.weight_version == parts[0].record.weight_version


def test_turn_sent_with_a_later_routing_start_is_refused_as_a_gap(url, conversation):
    _, parts = conversation
    prompt = list(parts[0].tokens) + TURN2_USER
    _, late = _turn(url, prompt, routing_start=len(parts[0].tokens) + 2)
    with pytest.raises(RecordError, match=r"part 1: .*leaving tokens"):
        join_records([parts[0], late])


def test_turn_sent_with_an_earlier_routing_start_is_refused_as_an_overlap(url, conversation):
    _, parts = conversation
    prompt = list(parts[0].tokens) + TURN2_USER
    _, early = _turn(url, prompt, routing_start=len(parts[0].tokens) - 4)
    with pytest.raises(RecordError, match=r"part 1: .*overlapping"):
        join_records([parts[0], early])


def test_turn_of_another_sample_is_refused(url, conversation):
    _, parts = conversation
    other = list(parts[0].tokens)
    other[3] = other[3] % 250 + 1  # same length, different history
    _, stranger = _turn(url, other + TURN2_USER, routing_start=len(other) - 1)
    with pytest.raises(RecordError, match=r"part 1: token 3 is"):
        join_records([parts[0], stranger])


def test_part_whose_digest_does_not_match_its_tokens_is_refused(conversation):
    _, parts = conversation
    wrong = list(parts[1].tokens)
    wrong[-1] = wrong[-1] % 250 + 1
    with pytest.raises(RecordError, match=r"part 1: tokens_digest"):
        join_records([parts[0], RecordPart(parts[1].record, wrong)])


def test_first_part_must_start_at_token_zero(conversation):
    _, parts = conversation
    with pytest.raises(RecordError, match=r"part 0 starts at token"):
        join_records(parts[1:])


def _versioned(part: RecordPart, version: str) -> RecordPart:
    return RecordPart(dataclasses.replace(part.record, weight_version=version), part.tokens)


def test_mixed_weight_versions_are_refused_by_default(conversation):
    _, parts = conversation
    mixed = [_versioned(parts[0], "v1"), _versioned(parts[1], "v2")]
    with pytest.raises(RecordError, match=r"part 0: 'v1', part 1: 'v2'"):
        join_records(mixed)


def test_mixed_weight_versions_when_allowed_are_named_per_segment_and_refused_by_a_versioned_trainer(
    layout, conversation
):
    _, parts = conversation
    mixed = [_versioned(parts[0], "v1"), _versioned(parts[1], "v2"), _versioned(parts[2], "v2")]
    joined = join_records(mixed, allow_mixed_versions=True)
    assert joined.record.weight_version == "mixed:v1,v2"
    assert joined.weight_versions == ("v1", "v2", "v2")
    with pytest.raises(RecordError, match="routed under several weight versions"):
        check_records([joined.record], [joined.tokens], layout)
    check_records([joined.record], [joined.tokens], layout, allow_mixed_versions=True)
    with pytest.raises(RecordError, match="weight version"):
        check_records([joined.record], [joined.tokens], layout, weight_version="v2")
