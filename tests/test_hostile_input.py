"""Hostile /generate bodies get a 4xx that says what is wrong; the server never answers 5xx, never
drops the connection, never dies, and routes exactly as before afterwards.

Every case states its expected outcome up front:

* ``BAD``         -- a 4xx whose body carries a non-empty error message;
* ``OK``          -- 200 with a generate response: bodies that are odd but harmless and that
                     SGLang's own handler serves too (unknown fields ignored, a ``model`` field as
                     the gateway adds, an image on a text-only model ignored, ...);
* ``STREAM_ERROR``-- ``"stream": true`` bodies refused inside the TokenizerManager: as in SGLang's
                     own handler, the 200 header is already out and the stream carries the error.

The seeded fuzz builds its bodies from one valid request by mutation, so a failure names the
mutation. Bodies generate at most 4 tokens.
"""

from __future__ import annotations

import importlib.metadata
import json
import random
from dataclasses import dataclass, field
from typing import Any, Dict, List, Optional

import httpx
import msgpack
import numpy as np
import pytest

from sglang_r3_server.body import MAX_JSON_DEPTH, too_deep
from sglang_r3.dev.embedded import EMBEDDED_CONFIG
from tests.support.routing_http import TIMEOUT, greedy, record_of

pytestmark = [pytest.mark.fast, pytest.mark.release]

VOCAB = EMBEDDED_CONFIG["vocab_size"]
HIDDEN = EMBEDDED_CONFIG["hidden_size"]
PROMPT = list(b"hostile input")  # byte-level tokenizer: id == byte
MSGPACK = "application/msgpack"

BAD, OK, STREAM_ERROR = "4xx", "200", "stream-error"

# The 4xx expected of a BAD body are SGLang 0.5.23's answers (its typed body contract, its limits on stop
# strings, thinking budgets, pooling indices ...). SGLang 0.5.15 has no contract and fewer limits: there a
# BAD body may also be served (200, a clean generate output); what still holds is what the guard is for:
# no 5xx, no dead server, routing exact after the fuzz (wrong types 0.5.15 would act on are refused by
# input_guard.body_type_error).
LENIENT_RELEASE = importlib.metadata.version("sglang") == "0.5.15.post1"
SEED = 20261130


@dataclass
class Case:
    name: str
    body: Any  # a JSON-able value, or raw bytes sent as they are
    expect: str
    headers: Dict[str, str] = field(default_factory=dict)

    def content(self) -> bytes:
        if isinstance(self.body, bytes):
            return self.body
        return json.dumps(self.body).encode()


def base(**extra) -> Dict[str, Any]:
    body: Dict[str, Any] = {"input_ids": list(PROMPT), "sampling_params": {"max_new_tokens": 2, "temperature": 0}}
    body.update(extra)
    return body


def with_sp(**sp) -> Dict[str, Any]:
    body = base()
    body["sampling_params"].update(sp)
    return body


def nested(depth: int, leaf: Any = 1) -> Any:
    v = leaf
    for _ in range(depth):
        v = [v]
    return v


def nested_obj(depth: int) -> Any:
    v: Any = 1
    for _ in range(depth):
        v = {"a": v}
    return v


# ---------------------------------------------------------------------------
# Wrong types: every known field gets values of every type it does not take.
# ---------------------------------------------------------------------------

WRONG = {
    "bool": [1, 0, "true", 1.5, [True], {"a": True}],
    "int": ["1", 1.5, 4.0, True, [1], {"a": 1}],
    "real": ["0.5", True, [0.5], {"a": 0.5}],
    "str": [5, True, 1.5, {"a": "b"}, [1]],
    "str_or_list": [5, True, 1.5, {"a": "b"}, [1], [["a"]]],
    "ids": ["abc", 5, True, {"a": 1}, [1.5], ["a"], [None], [True], nested(3)],
    "obj": [5, "x", True, [1], 1.5],
    "str_map": [5, "x", [], {"a": 1}, {"a": None}],
}

TOP_LEVEL = {
    "input_ids": "ids",
    "text": "str_or_list",
    "rid": "str_or_list",
    "return_logprob": "bool",
    "logprob_start_len": "int",
    "top_logprobs_num": "int",
    "token_ids_logprob": "ids",
    "stream": "bool",
    "return_text_in_logprobs": "bool",
    "routed_dp_rank": "int",
    "priority": "int",
    "max_thinking_tokens": "int",
    "extra_key": "str_or_list",
    "cache_salt": "str_or_list",
    "require_reasoning": "bool",
    "lora_path": "str_or_list",
    "routing_key": "str",
    "session_id": "str",
    "custom_logit_processor": "str_or_list",
    "custom_labels": "str_map",
    "return_prompt_token_ids": "bool",
    "routed_experts_start_len": "int",
    "return_sampling_mask": "bool",
    "sampling_params": "obj",
    "session_params": "obj",
    "return_routed_experts": "bool",
    "routing_start": "int",
    # GenerateReqInput fields outside SGLang's JSON contract, normally set by SGLang itself
    "received_time": "real",
    "http_worker_ipc": "str",
    "conversation_id": "str",
    "log_metrics": "bool",
    "return_entropy": "bool",
    "return_bytes": "bool",
    "no_logs": "bool",
    "need_wait_for_mm_inputs": "bool",
    "external_trace_header": "obj",
    "mm_processor_kwargs": "obj",
}

SAMPLING = {
    "max_new_tokens": "int",
    "min_new_tokens": "int",
    "n": "int",
    "top_k": "int",
    "stream_interval": "int",
    "sampling_seed": "int",
    "beam_width": "int",
    "temperature": "real",
    "top_p": "real",
    "min_p": "real",
    "frequency_penalty": "real",
    "presence_penalty": "real",
    "repetition_penalty": "real",
    "ignore_eos": "bool",
    "skip_special_tokens": "bool",
    "spaces_between_special_tokens": "bool",
    "no_stop_trim": "bool",
    "stop": "str_or_list",
    "stop_regex": "str_or_list",
    "json_schema": "str",
    "regex": "str",
    "ebnf": "str",
    "structural_tag": "str",
    "stop_token_ids": "ids",
    "logit_bias": "str_map",
    "watermark": "obj",
}


def _skip_wrong(kind: str, name: str, value: Any) -> bool:
    # A list of strings is a batch of texts / rids, which is legal.
    return kind == "str_or_list" and isinstance(value, list) and all(isinstance(v, str) for v in value)


def wrong_type_cases() -> List[Case]:
    cases = []
    for name, kind in TOP_LEVEL.items():
        for value in WRONG[kind]:
            if _skip_wrong(kind, name, value):
                continue
            body = base(**{name: value})
            if name == "routing_start":
                body["return_routing"] = True
            if name == "text":
                del body["input_ids"]
            cases.append(Case(f"{name}={value!r}", body, BAD))
    for name, kind in SAMPLING.items():
        for value in WRONG[kind]:
            if _skip_wrong(kind, name, value):
                continue
            cases.append(Case(f"sampling_params.{name}={value!r}", with_sp(**{name: value}), BAD))
    for value in ["yes", 1, 0, 1.5, [], [True], None, {"mtp": "x"}, {"draft": True}, {"mtp": 1}]:
        cases.append(Case(f"return_routing={value!r}", base(return_routing=value), BAD))
    return cases


# ---------------------------------------------------------------------------
# Hand-picked cases: out-of-range numbers, shapes, encodings, headers, internal fields.
# ---------------------------------------------------------------------------

def classic_cases() -> List[Case]:
    sp = with_sp
    c = [
        # token ids the embedding cannot index
        Case("input_ids out of vocabulary", base(input_ids=[1, 2, 99999999]), BAD),
        Case("input_ids == vocab size", base(input_ids=[1, VOCAB]), BAD),
        Case("input_ids negative", base(input_ids=[1, -1, 3]), BAD),
        Case("input_ids int64 min", base(input_ids=[-(2**63)]), BAD),
        Case("input_ids beyond int64", base(input_ids=[2**64 + 5]), BAD),
        Case("input_ids 5000-digit number", b'{"input_ids": [' + b"9" * 5000 + b"]}", BAD),
        Case("batched input_ids, second prompt out of vocabulary", base(input_ids=[[1, 2], [3, 99999]]), BAD),
        Case("batched input_ids, second prompt negative", base(input_ids=[[1, 2], [-3]]), BAD),
        Case("batched input_ids, one prompt empty", base(input_ids=[[1, 2], []]), BAD),
        Case("top_logprobs_num beyond the vocabulary", base(return_logprob=True, top_logprobs_num=100000), BAD),
        Case("top_logprobs_num negative", base(return_logprob=True, top_logprobs_num=-1), BAD),
        Case("top_logprobs_num as a list for one prompt", base(return_logprob=True, top_logprobs_num=[1]), BAD),
        Case("logprob_start_len below -1", base(return_logprob=True, logprob_start_len=-5), BAD),
        Case("logprob_start_len beyond the prompt", base(return_logprob=True, logprob_start_len=999), BAD),
        Case("logprob_start_len as a list for one prompt", base(logprob_start_len=[1]), BAD),
        Case("token_ids_logprob out of vocabulary", base(return_logprob=True, token_ids_logprob=[1, VOCAB]), BAD),
        Case("stop_token_ids out of vocabulary", sp(min_new_tokens=1, stop_token_ids=[VOCAB + 80]), BAD),
        Case("stop_token_ids negative", sp(min_new_tokens=1, stop_token_ids=[-7]), BAD),
        Case("logit_bias key out of vocabulary", sp(logit_bias={str(VOCAB): 1.0}), BAD),
        Case("logit_bias key negative", sp(logit_bias={"-1": 1.0}), BAD),
        Case("logit_bias key not a number", sp(logit_bias={"abc": 1.0}), BAD),
        Case("top_k beyond int32", sp(top_k=2**32), BAD),
        Case("top_k zero", sp(top_k=0), BAD),
        Case("top_k -2", sp(top_k=-2), BAD),
        Case("min_new_tokens beyond int32", sp(max_new_tokens=2**32, min_new_tokens=2**32 - 1), BAD),
        Case("min_new_tokens above max_new_tokens", sp(min_new_tokens=3), BAD),
        Case("max_new_tokens negative", sp(max_new_tokens=-1), BAD),
        Case("max_new_tokens beyond the context", sp(max_new_tokens=1_000_000), BAD),
        Case("max_new_tokens 2**70", sp(max_new_tokens=2**70), BAD),
        Case("n = 0", sp(n=0), BAD),
        Case("n = -1", sp(n=-1), BAD),
        Case("n = null", sp(n=None), BAD),
        Case("n = 10**9", sp(n=10**9), BAD),
        Case("n times the batch beyond 65536", dict(base(input_ids=[[1], [2], [3]]), sampling_params={"n": 30000}), BAD),
        Case("temperature negative", sp(temperature=-1.0), BAD),
        Case("temperature NaN", b'{"input_ids": [1, 2], "sampling_params": {"temperature": NaN}}', BAD),
        Case("temperature Infinity", b'{"input_ids": [1, 2], "sampling_params": {"temperature": Infinity}}', BAD),
        Case("logit_bias value NaN", b'{"input_ids": [1, 2], "sampling_params": {"logit_bias": {"5": NaN}}}', BAD),
        Case("top_p zero", sp(top_p=0.0), BAD),
        Case("top_p 1.5", sp(top_p=1.5), BAD),
        Case("min_p 2", sp(min_p=2.0), BAD),
        Case("frequency_penalty 3", sp(frequency_penalty=3.0), BAD),
        Case("presence_penalty -3", sp(presence_penalty=-3.0), BAD),
        Case("repetition_penalty zero", sp(repetition_penalty=0.0), BAD),
        Case("sampling_seed beyond int64", sp(sampling_seed=2**64), BAD),
        Case("beam_width beyond the vocabulary", sp(beam_width=100000), BAD),
        Case("unknown sampling param", sp(bogus=1), BAD),
        Case("more than 32 stop strings", sp(stop=[f"s{i}" for i in range(40)]), BAD),
        Case("invalid stop_regex", sp(stop_regex="("), BAD),
        Case("invalid regex grammar", sp(regex="("), BAD),
        Case("json_schema not JSON", sp(json_schema="not json"), BAD),
        Case("regex nested 5000 deep", sp(regex="(" * 5000 + "a" + ")" * 5000), BAD),
        Case("ebnf nested 5000 deep", sp(ebnf="root ::= " + "(" * 5000 + '"a"' + ")" * 5000), BAD),
        Case("json_schema nested 3000 deep",
             sp(json_schema='{"type":"object","properties":{"a":' * 3000 + '{"type":"integer"}' + "}}" * 3000), BAD),
        Case("stop_regex longer than 256 bytes", sp(stop_regex="a" * 300), BAD),
        Case("two grammars at once", sp(regex="a+", ebnf='root ::= "a"'), BAD),
        Case("watermark on a server without it", sp(watermark={"enabled": True}), BAD),
        # empties
        Case("empty body", b"", BAD),
        Case("whitespace body", b"   \n ", BAD),
        Case("empty object", {}, BAD),
        Case("empty text", {"text": "", "sampling_params": {"max_new_tokens": 2}}, BAD),
        Case("empty input_ids", base(input_ids=[]), BAD),
        Case("empty text batch", {"text": [], "sampling_params": {"max_new_tokens": 2}}, BAD),
        Case("text batch with an empty prompt", {"text": ["ab", ""], "sampling_params": {"max_new_tokens": 2}}, BAD),
        Case("empty sampling_params list", base(sampling_params=[]), BAD),
        Case("only sampling_params", {"sampling_params": {"max_new_tokens": 2}}, BAD),
        Case("text and input_ids null", {"text": None, "input_ids": None}, BAD),
        # batch shapes
        Case("sampling_params list shorter than the batch", base(input_ids=[[1], [2], [3]], sampling_params=[{}, {}]), BAD),
        Case("sampling_params list for a single prompt", base(sampling_params=[{"max_new_tokens": 2}]), BAD),
        Case("rid list shorter than the batch", base(input_ids=[[1], [2]], rid=["a"]), BAD),
        Case("return_logprob list shorter than the batch", base(input_ids=[[1], [2]], return_logprob=[True]), BAD),
        Case("duplicate rids in a batch", base(input_ids=[[1], [2]], rid=["a", "a"]), BAD),
        Case("n disagrees across the batch", base(input_ids=[[1], [2]], sampling_params=[{"n": 1}, {"n": 2}]), BAD),
        Case("a bad sampling_params entry after good ones",
             base(input_ids=[[1], [2], [3]], sampling_params=[{"max_new_tokens": 2}, {"max_new_tokens": 2}, {"top_k": 0}]), BAD),
        Case("one shared sampling_params for a batch, bad",
             base(input_ids=[[1], [2]], sampling_params={"max_new_tokens": 2, "stop_token_ids": [99999999]}), BAD),
        Case("rid list for one prompt", base(rid=["a"]), BAD),
        # top level is not an object
        Case("top-level array", [1, 2], BAD),
        Case("top-level array of bodies", [base()], BAD),
        Case("top-level string", "generate", BAD),
        Case("top-level number", 5, BAD),
        Case("top-level null", None, BAD),
        Case("top-level true", True, BAD),
        # not JSON
        Case("truncated JSON", b'{"input_ids": [1, 2', BAD),
        Case("trailing comma", b'{"input_ids": [1, 2],}', BAD),
        Case("single quotes", b"{'input_ids': [1, 2]}", BAD),
        Case("comment", b'{"input_ids": [1] /* hi */}', BAD),
        Case("trailing garbage", b'{"input_ids": [1]} x', BAD),
        Case("two objects", b'{"input_ids": [1]}{"input_ids": [2]}', BAD),
        Case("not JSON at all", b"generate please", BAD),
        Case("non-UTF-8 bytes", b'{"text": "a\xff\xfeb"}', BAD),
        Case("Latin-1 body", '{"text": "caf\xe9"}'.encode("latin-1"), BAD),
        # JSON exchanged between systems is UTF-8 (RFC 8259, section 8.1)
        Case("UTF-16 body", json.dumps(base()).encode("utf-16"), BAD),
        Case("lone surrogate in text", b'{"text": "ab\\ud800cd", "sampling_params": {"max_new_tokens": 2}}', BAD),
        Case("lone surrogate in rid", b'{"input_ids": [1, 2], "rid": "\\udfff", "sampling_params": {"max_new_tokens": 2}}', BAD),
        Case("lone surrogate in a stop string", b'{"input_ids": [1, 2], "sampling_params": {"stop": ["\\ud801"]}}', BAD),
        Case("msgpack body", msgpack.packb(base()), BAD, {"content-type": MSGPACK}),
        # deep nesting, past every parser's own limit too: refused before parsing, unknown fields included
        # (server/body.py; whatever the installed orjson would do with them)
        Case("input_ids nested 100k deep", b'{"input_ids": ' + b"[" * 100_000 + b"]" * 100_000 + b"}", BAD),
        Case("sampling_params nested 100k deep",
             b'{"input_ids": [1], "sampling_params": ' + b'{"a": ' * 100_000 + b"1" + b"}" * 100_001, BAD),
        Case("unknown field nested 100k deep",
             b'{"input_ids": [1], "sampling_params": {"max_new_tokens": 2}, "x": ' + b"[" * 100_000 + b"]" * 100_000 + b"}",
             BAD),
        Case("unknown field one level past the depth limit", base(bogus=nested(MAX_JSON_DEPTH)), BAD),
        Case("input_ids nested 50 deep", base(input_ids=nested(50)), BAD),
        Case("input_ids nested 500 deep", base(input_ids=nested(500)), BAD),
        Case("text nested 200 deep", {"text": nested(200, "a")}, BAD),
        Case("sampling_params nested 300 deep", base(sampling_params=nested_obj(300)), BAD),
        Case("session_params nested 300 deep", base(session_params=nested_obj(300)), BAD),
        # huge
        Case("1 MB text", {"text": "a" * 1_000_000, "sampling_params": {"max_new_tokens": 2}}, BAD),
        Case("1 MB of non-ASCII text", {"text": "\u00e9" * 500_000, "sampling_params": {"max_new_tokens": 2}}, BAD),
        Case("100k token ids", base(input_ids=[7] * 100_000), BAD),
        Case("batch whose last prompt has a bad id", base(input_ids=[[1]] * 3 + [[VOCAB]]), BAD),
        # routing options
        Case("routing_start negative", base(return_routing=True, routing_start=-1), BAD),
        Case("routing_start beyond the prompt", base(return_routing=True, routing_start=999), BAD),
        Case("routing_start without return_routing", base(routing_start=1), BAD),
        Case("routing_start and routed_experts_start_len disagree",
             base(return_routing=True, routing_start=1, routed_experts_start_len=2), BAD),
        Case("routed_experts_start_len beyond the prompt", base(return_routed_experts=True, routed_experts_start_len=999), BAD),
        Case("routed_experts_start_len negative", base(return_routed_experts=True, routed_experts_start_len=-1), BAD),
        Case("bad routing option, msgpack asked", base(return_routing="yes"), BAD, {"accept": MSGPACK}),
        Case("bad id, msgpack asked", base(input_ids=[VOCAB]), BAD, {"accept": MSGPACK}),
        Case("not JSON, msgpack asked", b"{", BAD, {"accept": MSGPACK}),
        # fields SGLang sets itself
        Case("received_time a string", base(received_time="yesterday"), BAD),
        Case("lora_id without lora_path", base(lora_id="x"), BAD),
        Case("lora_path on a server without LoRA", base(lora_path="adapter"), BAD),
        Case("positional_embed_overrides as JSON", base(positional_embed_overrides={"embeds": [], "positions": [0]}), BAD),
        Case("token_indices_to_pool out of the prompt",
             base(sampling_params={"max_new_tokens": 0}, return_logprob=True, logprob_start_len=0, token_indices_to_pool=[99]), BAD),
        Case("token_indices_to_pool on a cached prompt", base(sampling_params={"max_new_tokens": 0}, token_indices_to_pool=[0]), BAD),
        Case("multi_item_delimiter_indices out of the prompt",
             base(sampling_params={"max_new_tokens": 0}, return_logprob=True, logprob_start_len=0,
                  multi_item_delimiter_indices=[-1]), BAD),
        Case("sampling_logprobs_mode unknown", base(sampling_logprobs_mode="bogus"), BAD),
        Case("custom_logit_processor on a server without it", base(custom_logit_processor="x"), BAD),
        Case("session that does not exist", base(session_params={"id": "no-such-session"}), BAD),
        Case("session_params with an unknown key", base(session_params={"bogus": 1}), BAD),
        Case("input_embeds with the radix cache on", {"input_embeds": [[0.1] * HIDDEN], "sampling_params": {"max_new_tokens": 2}}, BAD),
        Case("routed_dp_rank out of range", base(routed_dp_rank=5), BAD),
        Case("max_thinking_tokens without strict thinking", base(max_thinking_tokens=5), BAD),
        Case("return_hidden_states on a server without it", base(return_hidden_states=True), BAD),
        # odd but harmless: SGLang's own handler serves these too
        Case("unknown top-level field", base(bogus_field=123), OK),
        Case("model field, as the gateway adds", base(model="whatever"), OK),
        Case("model null", base(model=None), OK),
        Case("unknown field nested 500 deep", base(bogus=nested(500)), OK),
        Case("unknown field nested to the depth limit", base(bogus=nested(MAX_JSON_DEPTH - 1)), OK),
        Case("1 MB unknown field", base(padding="x" * 1_000_000), OK),
        Case("1 MB rid", base(rid="r" * 1_000_000), OK),
        Case("64 kB stop string", with_sp(stop="z" * 65536), OK),
        Case("stop_regex nested 100 deep", with_sp(stop_regex="(" * 100 + "a" + ")" * 100), OK),
        Case("image on a text-only model", base(image_data="data:image/png;base64,AAAA"), OK),
        Case("received_time far in the future", base(received_time=1e300), OK),
        Case("stream_interval 0", dict(with_sp(stream_interval=0), stream=True), OK),
        Case("stream_interval negative", dict(with_sp(stream_interval=-3), stream=True), OK),
        Case("max_new_tokens 0", with_sp(max_new_tokens=0), OK),
        Case("huge temperature", with_sp(temperature=1e300), OK),
        Case("top_k -1 (all)", with_sp(top_k=-1), OK),
        Case("empty stop list", with_sp(stop=[]), OK),
        Case("empty stop_token_ids", with_sp(stop_token_ids=[]), OK),
        Case("n = 2", with_sp(n=2), OK),
        Case("duplicate keys (last wins)", b'{"input_ids": [1], "input_ids": [1, 2], "sampling_params": {"max_new_tokens": 2}}', OK),
        Case("JSON with a text/plain content type", base(), OK, {"content-type": "text/plain"}),
        Case("msgpack asked", base(), OK, {"accept": MSGPACK}),
        Case("msgpack and JSON both accepted", base(), OK, {"accept": f"application/json, {MSGPACK}"}),
        Case("any type accepted", base(), OK, {"accept": "*/*"}),
        Case("HTML accepted only", base(), OK, {"accept": "text/html"}),
        Case("garbage accept header", base(), OK, {"accept": ";;;,,,=="}),
        Case("routing asked, msgpack", base(return_routing=True), OK, {"accept": MSGPACK}),
        Case("routing with MTP section on a non-speculative server (refused by name)", base(return_routing={"mtp": True}), BAD),
        Case("routing_start at the prompt length", base(return_routing=True, routing_start=len(PROMPT)), OK),
        Case("batch of two prompts with routing", base(input_ids=[[1, 2], [3, 4]], return_routing=True), OK),
        Case("scoring-style pooling request",
             base(sampling_params={"max_new_tokens": 0}, return_logprob=True, logprob_start_len=0,
                  token_indices_to_pool=[0, 2]), OK),
        # stream: refusals from the TokenizerManager arrive inside the 200 stream, as in SGLang's handler
        Case("stream with an out-of-vocabulary id", base(stream=True, input_ids=[VOCAB]), STREAM_ERROR),
        Case("stream with top_logprobs_num beyond the vocabulary",
             base(stream=True, return_logprob=True, top_logprobs_num=VOCAB + 1), STREAM_ERROR),
        Case("stream with an empty text", {"text": "", "stream": True}, STREAM_ERROR),
        Case("stream with an out-of-vocabulary id, msgpack", base(stream=True, input_ids=[-1]), STREAM_ERROR,
             {"accept": MSGPACK}),
        Case("stream with a bad routing option", base(stream=True, return_routing="yes"), BAD),
        Case("stream that is fine", base(stream=True), OK),
        Case("stream that is fine, msgpack", base(stream=True, return_routing=True), OK, {"accept": MSGPACK}),
    ]
    return c


# ---------------------------------------------------------------------------
# Seeded combinations: one or two bad mutations, and up to two harmless ones, on a valid body.
# ---------------------------------------------------------------------------

HARMLESS = [
    ("model", "m"),
    ("bogus", {"x": [1, 2]}),
    ("rid", None),
    ("return_logprob", False),
    ("return_routing", False),
    ("return_routing", True),
    ("extra_key", "k"),
    ("priority", None),
]


def seeded_cases(n: int = 120) -> List[Case]:
    rng = random.Random(SEED)
    bad_pool: List[tuple] = []
    for name, kind in TOP_LEVEL.items():
        if name in ("text", "stream", "routing_start", "input_ids", "sampling_params"):
            continue  # these change the request's shape; covered above
        bad_pool += [("top", name, v) for v in WRONG[kind] if not _skip_wrong(kind, name, v)]
    for name, kind in SAMPLING.items():
        bad_pool += [("sp", name, v) for v in WRONG[kind] if not _skip_wrong(kind, name, v)]
    bad_pool += [
        ("top", "input_ids", [1, VOCAB + rng.randrange(1, 10**6)]),
        ("top", "input_ids", [rng.randrange(-(10**6), 0)]),
        ("top", "top_logprobs_num", VOCAB + 1),
        ("sp", "stop_token_ids", [VOCAB]),
        ("sp", "top_k", 2**31),
        ("sp", "n", 0),
        ("sp", "max_new_tokens", -1),
    ]
    cases = []
    for i in range(n):
        body = base()
        picks = rng.sample(bad_pool, rng.randint(1, 2))
        picks = list({(w, name): (w, name, v) for w, name, v in picks}.values())
        harmless = rng.sample(HARMLESS, rng.randint(0, 2))
        desc = []
        for where, name, value in picks:
            if where == "top":
                body[name] = value
            else:
                body["sampling_params"][name] = value
            desc.append(f"{where}.{name}={value!r}")
        for name, value in harmless:
            if name not in body:
                body[name] = value
                desc.append(f"+{name}={value!r}")
        headers = {"accept": MSGPACK} if rng.random() < 0.25 else {}
        cases.append(Case(f"seeded#{i}: " + ", ".join(desc), body, BAD, headers))
    return cases


def all_cases() -> List[Case]:
    return classic_cases() + wrong_type_cases() + seeded_cases()


# ---------------------------------------------------------------------------
# Checking one answer
# ---------------------------------------------------------------------------

def _decode(resp: httpx.Response) -> Any:
    if MSGPACK in resp.headers.get("content-type", ""):
        return msgpack.unpackb(resp.content, raw=False)
    return resp.json()


def error_message(resp: httpx.Response) -> str:
    try:
        body = _decode(resp)
    except ValueError:  # JSON and msgpack decode errors both derive from it
        return resp.text
    err = body.get("error") if isinstance(body, dict) else None
    if isinstance(err, dict):
        return str(err.get("message") or "")
    return str(err or "")


def _is_generate_output(out: Any) -> bool:
    items = out if isinstance(out, list) else [out]
    return bool(items) and all(isinstance(o, dict) and "output_ids" in o and "meta_info" in o for o in items)


def _sse_events(resp: httpx.Response) -> List[Any]:
    events = []
    for line in resp.text.splitlines():
        if line.startswith("data: ") and line != "data: [DONE]":
            events.append(json.loads(line[len("data: "):]))
    return events


def _msgpack_stream(content: bytes) -> List[Any]:
    unpacker = msgpack.Unpacker(raw=False)
    unpacker.feed(content)
    return list(unpacker)


def check(case: Case, resp: httpx.Response) -> Optional[str]:
    """None when the answer is what the case expects, else why not."""
    status = resp.status_code
    if status >= 500:
        return f"{status}: {resp.text[:200]}"
    if case.expect == BAD and LENIENT_RELEASE and status == 200 and _is_generate_output(_decode_or_none(resp)):
        return None  # 0.5.15 serves what its own code accepts (see LENIENT_RELEASE)
    if case.expect == BAD:
        if not 400 <= status < 500:
            return f"expected a 4xx, got {status}: {resp.text[:200]}"
        if not error_message(resp).strip():
            return f"{status} without an error message: {resp.text[:200]}"
        return None
    if status != 200:
        return f"expected 200, got {status}: {resp.text[:200]}"
    is_stream = isinstance(case.body, dict) and case.body.get("stream") is True
    if is_stream:
        binary = MSGPACK in resp.headers.get("content-type", "")
        events = _msgpack_stream(resp.content) if binary else _sse_events(resp)
        errors = [e for e in events if isinstance(e, dict) and "error" in e]
        if case.expect == STREAM_ERROR:
            if not errors or not str(errors[0]["error"].get("message", "")).strip():
                return f"expected an error event in the stream, got {resp.content[:200]!r}"
            if any("output_ids" in e for e in events):
                return "the stream carried output as well as the error"
            return None
        if errors or not events or not all(_is_generate_output(e) for e in events):
            return f"expected a clean stream, got {resp.content[:200]!r}"
        return None
    if case.expect == STREAM_ERROR:
        return "expected a stream"
    try:
        out = _decode(resp)
    except ValueError as e:
        return f"200 with an undecodable body ({e}): {resp.content[:200]!r}"
    if not _is_generate_output(out):
        return f"200 without a generate response: {resp.content[:200]!r}"
    return None


def _decode_or_none(resp: httpx.Response) -> Any:
    try:
        return _decode(resp)
    except ValueError:
        return None


def post(client: httpx.Client, url: str, case: Case) -> httpx.Response:
    headers = {"content-type": "application/json", **case.headers}
    return client.post(url + "/generate", content=case.content(), headers=headers)


# ---------------------------------------------------------------------------
# Tests
# ---------------------------------------------------------------------------

@pytest.fixture(scope="module")
def url(nospec_server):
    return nospec_server


def routed_reference(url: str):
    out = greedy(url, 8, input_ids=list(b"routing must survive the fuzz"), return_routing=True)
    return out["output_ids"], record_of(out)


def _max_new_tokens(case: Case) -> Optional[int]:
    # Only bodies within the depth limit are read back (stdlib json reads those whatever its release);
    # a deeper one is refused by the server and asks for nothing.
    if too_deep(case.content()) is not None:
        return None
    body = json.loads(case.body) if isinstance(case.body, bytes) else case.body
    sp = body.get("sampling_params") if isinstance(body, dict) else None
    return sp.get("max_new_tokens") if isinstance(sp, dict) else None


def test_case_set_is_deterministic_large_and_cheap():
    cases = all_cases()
    assert [(c.name, c.content()) for c in cases] == [(c.name, c.content()) for c in all_cases()]
    assert len(cases) >= 200
    assert len({c.name for c in cases}) == len(cases), "case names must tell cases apart"
    costly = [c.name for c in cases if c.expect == OK and _max_new_tokens(c) not in range(5)]
    assert not costly, f"bodies that generate must ask for at most 4 tokens: {costly}"


def test_every_case_nested_past_the_depth_limit_expects_a_4xx_and_the_limit_is_probed_from_both_sides():
    deep = {c.name: c.expect for c in all_cases() if too_deep(c.content()) is not None}
    assert deep and set(deep.values()) == {BAD}, deep
    assert "unknown field one level past the depth limit" in deep
    assert "unknown field nested to the depth limit" not in deep


def test_out_of_vocabulary_id_gets_400_naming_its_index_on_generate(url):
    r = httpx.post(url + "/generate", json=base(input_ids=[5, 6, 7, 99999999]), timeout=TIMEOUT)
    assert r.status_code == 400, r.text
    assert error_message(r) == f"input_ids[3] = 99999999 is outside the vocabulary [0, {VOCAB})"


def test_out_of_vocabulary_id_in_a_batch_names_prompt_and_position(url):
    r = httpx.post(url + "/generate", json=base(input_ids=[[5, 6], [7, -2, 8]]), timeout=TIMEOUT)
    assert r.status_code == 400, r.text
    assert error_message(r) == f"input_ids[1][1] = -2 is outside the vocabulary [0, {VOCAB})"


def test_each_distinct_sampling_params_of_a_batch_is_checked_and_named_by_prompt(url):
    # One object for the whole batch is checked once (for its first prompt); a per-prompt list is checked
    # entry by entry, so a bad last entry after good ones is still found.
    good = {"max_new_tokens": 2, "temperature": 0}
    bad = {"max_new_tokens": 2, "stop_token_ids": [VOCAB + 1]}
    body = base(input_ids=[[5], [6], [7], [8]], sampling_params=[good, good, good, bad])
    r = httpx.post(url + "/generate", json=body, timeout=TIMEOUT)
    assert r.status_code == 400, r.text
    assert error_message(r) == f"sampling_params[3].stop_token_ids[0] = {VOCAB + 1} is outside the vocabulary [0, {VOCAB})"
    shared = base(input_ids=[[5], [6]], sampling_params={"max_new_tokens": 2, "stop_token_ids": [VOCAB]})
    r = httpx.post(url + "/generate", json=shared, timeout=TIMEOUT)
    assert r.status_code == 400, r.text
    assert error_message(r) == f"sampling_params[0].stop_token_ids[0] = {VOCAB} is outside the vocabulary [0, {VOCAB})"


def test_out_of_vocabulary_id_gets_400_naming_its_index_on_completions(url):
    body = {"model": "m", "prompt": [5, 6, VOCAB + 3], "max_tokens": 2}
    r = httpx.post(url + "/v1/completions", json=body, timeout=TIMEOUT)
    assert r.status_code == 400, r.text
    assert r.json()["message"] == f"input_ids[2] = {VOCAB + 3} is outside the vocabulary [0, {VOCAB})"


def test_nesting_past_the_stated_limit_gets_400_naming_the_limit_and_field_and_at_the_limit_is_served(url):
    # The depth contract is ours (server/body.py): the same answer whatever parser release is installed.
    for depth in (MAX_JSON_DEPTH, 2_000, 100_000):  # one past the limit, past stdlib json's, past orjson 3.13's
        body = b'{"input_ids": [1], "sampling_params": {"max_new_tokens": 2}, "x": ' + b"[" * depth + b"]" * depth + b"}"
        r = httpx.post(url + "/generate", content=body, headers={"content-type": "application/json"}, timeout=TIMEOUT)
        assert r.status_code == 400, r.text[:300]
        err = r.json()["error"]
        assert err["field"] == "x" and f"deeper than {MAX_JSON_DEPTH} levels" in err["message"], err
    at_limit = base(x=nested(MAX_JSON_DEPTH - 1), return_routing=True)  # the top-level object is level 1
    r = httpx.post(url + "/generate", json=at_limit, timeout=TIMEOUT)
    assert r.status_code == 200, r.text[:300]
    assert "routing" in r.json()["meta_info"]


def test_top_logprobs_num_beyond_vocabulary_gets_400_naming_the_field(url):
    r = httpx.post(url + "/generate", json=base(return_logprob=True, top_logprobs_num=100000), timeout=TIMEOUT)
    assert r.status_code == 400, r.text
    assert "top_logprobs_num" in error_message(r) and str(VOCAB) in error_message(r)


def test_hostile_bodies_get_their_expected_answer_and_routing_stays_exact(url):
    ids_before, rec_before = routed_reference(url)
    failures = []
    with httpx.Client(timeout=TIMEOUT) as client:
        for case in all_cases():
            try:
                resp = post(client, url, case)
            except httpx.HTTPError as e:  # a dropped connection or a dead server
                failures.append(f"{case.name}: {type(e).__name__}: {e}")
                if httpx.get(url + "/health", timeout=30).status_code != 200:
                    break
                continue
            why = check(case, resp)
            if why:
                failures.append(f"{case.name}: {why}")
    assert httpx.get(url + "/health_generate", timeout=TIMEOUT).status_code == 200
    assert not failures, f"{len(failures)} case(s) answered wrongly:\n" + "\n".join(failures)
    ids_after, rec_after = routed_reference(url)
    assert ids_after == ids_before
    assert rec_after.layers == rec_before.layers and rec_after.start == rec_before.start
    np.testing.assert_array_equal(rec_after.experts, rec_before.experts)


# -- text prompts: the tokenizer's own ids ---------------------------------------------------------------
# The guard skips the per-id check for ids a fast HF tokenizer produced from a text prompt when that
# tokenizer's largest id is inside the model's vocabulary; a tokenizer that can emit more ids than the
# model embeds keeps every text prompt checked.


def _embedded_tokenizer():
    from transformers import AutoTokenizer

    from sglang_r3.dev.embedded import ensure_embedded_model

    return AutoTokenizer.from_pretrained(str(ensure_embedded_model()))


@pytest.mark.sglang  # sglang_r3.serving.adapter imports SGLang
def test_tokenizer_max_id_is_measured_again_when_tokens_are_added_and_unknown_for_other_tokenizers():
    from sglang_r3.serving.refusals.input_guard import tokenizer_max_id

    tok = _embedded_tokenizer()
    assert tokenizer_max_id(tok) == max(tok.get_vocab().values()) == len(tok) - 1
    tok.add_tokens(["<r3-added-a>", "<r3-added-b>"])
    assert tokenizer_max_id(tok) == tok.convert_tokens_to_ids("<r3-added-b>") == len(tok) - 1

    class Wrapper:  # a tokenizer wrapper whose get_vocab need not list its special tokens
        def get_vocab(self):
            return {"a": 0}

        def __len__(self):
            return 1

    assert tokenizer_max_id(Wrapper()) is None and tokenizer_max_id(None) is None


@pytest.fixture(scope="module")
def wide_tokenizer_url(tmp_path_factory):
    """The embedded model served (no speculation) with its tokenizer plus added tokens whose ids run 10
    past the model's vocabulary."""
    from tests.support.servers import ServerProcess

    tok = _embedded_tokenizer()
    tok.add_tokens([f"<r3-beyond-{i}>" for i in range(VOCAB - len(tok) + 10)])
    assert len(tok) == VOCAB + 10
    path = tmp_path_factory.mktemp("wide-tokenizer")
    tok.save_pretrained(str(path))
    server = ServerProcess(["--disable-speculation", "--tokenizer-path", str(path)]).start()
    try:
        yield server.wait_ready().url
    finally:
        server.stop()


@pytest.mark.server  # wide_tokenizer_url serves
def test_text_that_tokenizes_beyond_the_model_vocabulary_gets_400_and_the_server_stays_up(wide_tokenizer_url):
    url, beyond, inside = wide_tokenizer_url, VOCAB + 5, VOCAB - 3
    sp = {"max_new_tokens": 2, "temperature": 0}
    r = httpx.post(url + "/generate", json={"text": f"ab<r3-beyond-{beyond - 260}>", "sampling_params": sp}, timeout=TIMEOUT)
    assert r.status_code == 400, r.text
    assert error_message(r) == f"input_ids[2] = {beyond} is outside the vocabulary [0, {VOCAB})"
    batch = {"text": ["fine", f"<r3-beyond-{beyond - 260}>"], "sampling_params": sp}
    r = httpx.post(url + "/generate", json=batch, timeout=TIMEOUT)
    assert r.status_code == 400 and error_message(r).startswith(f"input_ids[1][0] = {beyond} "), r.text
    # An added token inside the vocabulary is served, and so is plain text, with routing.
    r = httpx.post(url + "/generate", json={"text": f"ab<r3-beyond-{inside - 260}>", "sampling_params": sp,
                                            "return_routing": True}, timeout=TIMEOUT)
    assert r.status_code == 200, r.text
    assert r.json()["meta_info"]["prompt_tokens"] == 3 and "routing" in r.json()["meta_info"]
    assert httpx.get(url + "/health_generate", timeout=TIMEOUT).status_code == 200
