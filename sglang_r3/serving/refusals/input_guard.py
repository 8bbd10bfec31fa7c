"""Refuse in the TokenizerManager every request field that would crash SGLang 0.5.23's scheduler or output
loop (ids outside the vocabulary, ``top_logprobs_num`` beyond it, int32 overflows, mismatched batch lists,
...): a 400 naming the field and index, for every entry point (``/generate``, ``/v1/*``, ``sglang.Engine``).
Ids a fast HF tokenizer produced from the request's own text skip the O(n) check when its largest id fits.
"""

from __future__ import annotations

import functools
import math
import numbers
import re
import typing
from typing import Any, Dict, Optional

import numpy as np

from sglang_r3.seam.hooks import register

_TM = "sglang.srt.managers.tokenizer_manager.TokenizerManager"
_GRI = "sglang.srt.managers.io_struct.GenerateReqInput"

INT32_MAX = 2**31 - 1
# Parallel sampling copies the request's lists n times in the TokenizerManager before anything
# is sent: n = 10**9 is tens of GB there (the process is OOM-killed). n = 1 copies nothing.
MAX_SEQUENCES = 65536
# Sub-requests of a batch carry their index so messages can point at the right prompt.
_BATCH_INDEX = "_sglang_r3_batch_index"
# ... and their batch's record of the sampling_params dicts already checked (id -> the dict itself, so an
# id can neither be reused nor match another object): SGLang hands every prompt of a batch the same dict
# (``[sp] * n``); checking it again for every prompt was a third of the guard's time per prompt.
_CHECKED_SP = "_sglang_r3_checked_sampling_params"

try:  # re._parser is the 3.11+ name; sampling_params.py parses stop_regex with it too
    import re._parser as _sre_parse
except ImportError:  # pragma: no cover - Python 3.10
    import sre_parse as _sre_parse


def _is_int(v: Any) -> bool:
    return isinstance(v, numbers.Integral) and not isinstance(v, (bool, np.bool_))


def _is_real(v: Any) -> bool:
    return isinstance(v, numbers.Real) and not isinstance(v, (bool, np.bool_))


def _is_bool(v: Any) -> bool:
    return isinstance(v, (bool, np.bool_))


def _show(v: Any) -> str:
    text = repr(v)
    return text if len(text) <= 60 else text[:57] + "..."


def check_utf8(value: Any, field: str) -> None:
    """Strings that reach the tokenizer or are echoed back (rid) must be valid Unicode: JSON's
    ``\\ud800`` escapes decode to lone surrogates, which the fast tokenizer and orjson reject
    with a TypeError (a 500)."""
    items = value if isinstance(value, list) else [value]
    for i, s in enumerate(items):
        if isinstance(s, str) and not s.isascii():
            try:
                s.encode("utf-8")
            except UnicodeEncodeError as e:
                where = f"{field}[{i}]" if isinstance(value, list) else field
                raise ValueError(f"{where} is not valid Unicode text ({e.reason} at character {e.start})") from None


def check_token_ids(ids: Any, field: str, vocab_size: int) -> None:
    """Every id an integer in [0, vocab_size). Fast path: one numpy conversion and min/max."""
    try:
        arr = np.asarray(ids)
    except (ValueError, TypeError):  # ragged nesting
        arr = None
    if arr is not None and arr.ndim == 1 and arr.dtype.kind in "iu":
        if arr.size == 0 or (int(arr.min()) >= 0 and int(arr.max()) < vocab_size):
            return
    # Slow path, only on the way to an error: find the first offending element.
    items = ids.tolist() if hasattr(ids, "tolist") else ids
    if not isinstance(items, (list, tuple)):
        raise ValueError(f"{field} must be a list of token ids, got {type(items).__name__}")
    for i, t in enumerate(items):
        if not _is_int(t):
            raise ValueError(f"{field}[{i}] = {_show(t)} is not a token id (an integer)")
        if not 0 <= t < vocab_size:
            raise ValueError(f"{field}[{i}] = {t} is outside the vocabulary [0, {vocab_size})")
    raise ValueError(f"{field} is not a flat list of token ids")


# ---------------------------------------------------------------------------
# sampling_params
# ---------------------------------------------------------------------------

_REAL_FIELDS = ("temperature", "top_p", "min_p", "frequency_penalty", "presence_penalty", "repetition_penalty")
_BOOL_FIELDS = ("ignore_eos", "skip_special_tokens", "spaces_between_special_tokens", "no_stop_trim")
_STR_FIELDS = ("json_schema", "regex", "ebnf", "structural_tag")


_KNOWN_SAMPLING: Optional[frozenset] = None
_MAX_STOP_REGEX_LEN = 0


def _load_sampling_limits() -> None:
    global _KNOWN_SAMPLING, _MAX_STOP_REGEX_LEN
    import msgspec

    from sglang.srt.sampling.sampling_params import SamplingParams

    from sglang_r3.seam.release import max_stop_regex_len

    limit = max_stop_regex_len()  # 0.5.15 has none: it parses every pattern, so we do too
    _MAX_STOP_REGEX_LEN = float("inf") if limit is None else limit
    _KNOWN_SAMPLING = frozenset(f.name for f in msgspec.structs.fields(SamplingParams))


def _int_in(sp: dict, name: str, where: str, lo: int, hi: int, hint: str = "") -> None:
    v = sp.get(name)
    if v is None:
        return
    if not _is_int(v):
        raise ValueError(f"{where}.{name} must be an integer, got {_show(v)}")
    if not lo <= v <= hi:
        raise ValueError(f"{where}.{name} = {v} is out of range [{lo}, {hi}]{hint}")


def check_sampling_params(sp: Any, where: str, vocab_size: int) -> None:
    if sp is None:
        return
    if not isinstance(sp, dict):
        raise ValueError(f"{where} must be an object, got {type(sp).__name__}")
    if _KNOWN_SAMPLING is None:
        _load_sampling_limits()
    unknown = [k for k in sp if k not in _KNOWN_SAMPLING]
    if unknown:
        raise ValueError(f"{where} has unknown field {unknown[0]!r}")

    # The scheduler builds int32 tensors from top_k and min_new_tokens.
    top_k = sp.get("top_k")
    if top_k is not None and (not _is_int(top_k) or not (top_k == -1 or 1 <= top_k <= INT32_MAX)):
        raise ValueError(f"{where}.top_k = {_show(top_k)} must be -1 (all) or an integer in [1, {INT32_MAX}]")
    _int_in(sp, "min_new_tokens", where, 0, INT32_MAX)
    _int_in(sp, "max_new_tokens", where, 0, INT32_MAX)
    _int_in(sp, "n", where, 1, INT32_MAX)
    _int_in(sp, "beam_width", where, 1, INT32_MAX)
    _int_in(sp, "stream_interval", where, -INT32_MAX, INT32_MAX)
    _int_in(sp, "sampling_seed", where, -(2**63), 2**63 - 1)
    for name in _REAL_FIELDS:
        v = sp.get(name)
        if v is not None and not _is_real(v):
            raise ValueError(f"{where}.{name} must be a number, got {_show(v)}")
    for name in _BOOL_FIELDS:
        v = sp.get(name)
        if v is not None and not _is_bool(v):
            raise ValueError(f"{where}.{name} must be true or false, got {_show(v)}")
    for name in _STR_FIELDS:
        v = sp.get(name)
        if v is not None and not isinstance(v, str):
            raise ValueError(f"{where}.{name} must be a string, got {_show(v)}")
        check_utf8(v, f"{where}.{name}")
    for name in ("stop", "stop_regex"):
        v = sp.get(name)
        items = [v] if isinstance(v, str) else v
        if items is None:
            continue
        if not isinstance(items, (list, tuple)) or not all(isinstance(s, str) for s in items):
            raise ValueError(f"{where}.{name} must be a string or a list of strings, got {_show(v)}")
        check_utf8(list(items), f"{where}.{name}")
        if name == "stop_regex":
            for i, pattern in enumerate(items):
                if len(pattern.encode("utf-8", "surrogatepass")) > _MAX_STOP_REGEX_LEN:
                    continue  # upstream refuses it by length; no need to parse a long one first
                try:
                    # upstream parses these outside any ValueError handler (re.error -> 500)
                    _sre_parse.parse(pattern)
                except (re.error, RecursionError, OverflowError) as e:
                    raise ValueError(f"{where}.stop_regex[{i}] is not a valid regular expression: {e}") from None

    stop_ids = sp.get("stop_token_ids")
    if stop_ids is not None:
        if isinstance(stop_ids, (str, bytes, dict)) or not hasattr(stop_ids, "__iter__"):
            raise ValueError(f"{where}.stop_token_ids must be a list of token ids, got {_show(stop_ids)}")
        # __post_init__ drops None entries; every other id indexes a vocab-sized penalty row
        ids = [t for t in stop_ids if t is not None]
        if ids:
            check_token_ids(ids, f"{where}.stop_token_ids", vocab_size)

    bias = sp.get("logit_bias")
    if bias is not None:
        if not isinstance(bias, dict):
            raise ValueError(f"{where}.logit_bias must be an object of token id -> bias, got {_show(bias)}")
        for key, value in bias.items():
            try:
                tid = int(key)
            except (TypeError, ValueError):
                raise ValueError(f"{where}.logit_bias key {key!r} is not a token id") from None
            if not 0 <= tid < vocab_size:
                raise ValueError(f"{where}.logit_bias key {key!r} is outside the vocabulary [0, {vocab_size})")
            if not _is_real(value) or not math.isfinite(value):
                raise ValueError(f"{where}.logit_bias[{key!r}] = {_show(value)} must be a finite number")

    custom = sp.get("custom_params")
    if custom is not None and not isinstance(custom, dict):
        raise ValueError(f"{where}.custom_params must be an object, got {_show(custom)}")


# ---------------------------------------------------------------------------
# The body's types where the release has no contract of its own (0.5.15)
# ---------------------------------------------------------------------------

# SGLang 0.5.23 checks a /generate body against its typed contract (entrypoints/api_contract.py) before
# anything reads it; 0.5.15 declares the same kind of types on GenerateReqInput and enforces none, and some
# wrong types get far: a dict `stream` streams (truthy), a string `routed_dp_rank` fails a `<` in
# generate_request (a 500), a dict `extra_key` or a float `routed_dp_rank` kills the scheduler. So there the
# body is checked against GenerateReqInput's own annotations: scalars exactly, lists one level deep (the
# token-id fields are the guard's own checks below, per id), anything else (Any, classes) left to SGLang.
_IDS_CHECKED_LATER = frozenset({"input_ids", "input_embeds", "token_ids_logprob", "multi_item_delimiter_indices"})
_SCALARS = {bool: _is_bool, int: _is_int, float: _is_real, str: lambda v: isinstance(v, str),
            bytes: lambda v: isinstance(v, (str, bytes))}


def _matches(v: Any, tp: Any, deep: bool) -> bool:
    if v is None or tp is Any:
        return True  # null is "not given" (SGLang's dataclass defaults stand in for it)
    origin = typing.get_origin(tp)
    if origin is typing.Union:
        return any(_matches(v, a, deep) for a in typing.get_args(tp) if a is not type(None))
    if tp in _SCALARS:
        return _SCALARS[tp](v)
    if origin is list:
        if not isinstance(v, list):
            return False
        (item,) = typing.get_args(tp) or (Any,)
        return not deep or all(_matches(x, item, deep=False) for x in v)
    if origin is dict or tp is dict:
        return isinstance(v, dict)
    return True  # a class or a form not declared in JSON terms: SGLang's to judge


@functools.lru_cache(maxsize=None)
def _declared_fields() -> Dict[str, Any]:
    from sglang.srt.managers.io_struct import GenerateReqInput

    return typing.get_type_hints(GenerateReqInput)


def body_type_error(body: Any) -> Optional[str]:
    """The first field of a /generate body whose value is not of the type GenerateReqInput declares for it
    (api.contract_error's answer where SGLang has no contract of its own), or None."""
    if not isinstance(body, dict):
        return None
    declared = _declared_fields()
    for field, value in body.items():
        tp = declared.get(field)
        if tp is not None and not _matches(value, tp, deep=field not in _IDS_CHECKED_LATER):
            return f"{field} = {_show(value)} is not of the declared type {_type_name(tp)}"
    return None


def _type_name(tp: Any) -> str:
    return tp.__name__ if isinstance(tp, type) else str(tp).replace("typing.", "")


# ---------------------------------------------------------------------------
# One prompt (TokenizerManager._validate_one_request)
# ---------------------------------------------------------------------------

def _name(field: str, obj: Any) -> str:
    i = getattr(obj, _BATCH_INDEX, None)
    return field if i is None else f"{field}[{i}]"


def _check_sampling_once(obj: Any, vocab_size: int) -> None:
    sp = obj.sampling_params
    checked = getattr(obj, "__dict__", {}).get(_CHECKED_SP)
    if checked is not None and isinstance(sp, dict) and checked.get(id(sp)) is sp:
        return  # this very dict passed for an earlier prompt of the batch
    check_sampling_params(sp, _name("sampling_params", obj), vocab_size)
    if checked is not None and isinstance(sp, dict):
        checked[id(sp)] = sp


def _check_generate_fields(obj: Any, vocab_size: int) -> None:
    _check_sampling_once(obj, vocab_size)
    for field in ("return_logprob", "stream", "return_text_in_logprobs", "return_sampling_mask"):
        v = getattr(obj, field, None)
        if v is not None and not _is_bool(v):
            raise ValueError(f"{_name(field, obj)} must be true or false, got {_show(v)}")
    v = obj.logprob_start_len
    if v is not None and (not _is_int(v) or v < -1):
        raise ValueError(f"{_name('logprob_start_len', obj)} = {_show(v)} must be -1 or a non-negative integer")
    v = obj.top_logprobs_num
    if v is not None and (not _is_int(v) or not 0 <= v <= vocab_size):
        raise ValueError(
            f"{_name('top_logprobs_num', obj)} = {_show(v)} must be an integer in [0, {vocab_size}] (the vocabulary size)"
        )
    v = obj.routed_experts_start_len
    if v is not None and (not _is_int(v) or v < 0):
        raise ValueError(f"{_name('routed_experts_start_len', obj)} = {_show(v)} must be a non-negative integer")
    v = obj.priority
    if v is not None and not _is_int(v):
        raise ValueError(f"{_name('priority', obj)} must be an integer, got {_show(v)}")
    v = obj.rid
    if v is not None and not isinstance(v, str):
        raise ValueError(f"{_name('rid', obj)} must be a string, got {_show(v)}")
    v = obj.session_params
    if v is not None:
        from sglang.srt.managers.io_struct import SessionParams

        if not isinstance(v, dict):
            raise ValueError(f"session_params must be an object, got {_show(v)}")
        try:
            SessionParams(**v)
        except TypeError as e:
            raise ValueError(f"session_params: {e}") from None


# id(tokenizer) -> (tokenizer, its size when measured, its largest id). A fast HF tokenizer emits only ids
# of its vocabulary (added and special tokens included), so when the largest is below the model's
# vocabulary every id it produced for a text prompt is in range and the per-id check is skipped.
_TOKENIZER_BOUND: dict = {}


def tokenizer_max_id(tokenizer: Any) -> Optional[int]:
    """The largest id ``tokenizer`` can emit, or None where that is not known for certain (anything
    but a fast HF tokenizer: a wrapper's get_vocab may leave out its special tokens)."""
    if tokenizer is None or not getattr(tokenizer, "is_fast", False) or not hasattr(tokenizer, "get_vocab"):
        return None
    size = len(tokenizer)  # grows when tokens are added: then measure again
    hit = _TOKENIZER_BOUND.get(id(tokenizer))
    if hit is not None and hit[0] is tokenizer and hit[1] == size:
        return hit[2]
    try:
        vocab = tokenizer.get_vocab()
        top = max(vocab.values()) if vocab else -1
    except Exception:  # noqa: BLE001 -- unknown: keep checking every id
        return None
    if not isinstance(top, int):
        return None
    _TOKENIZER_BOUND[id(tokenizer)] = (tokenizer, size, top)
    return top


def _ids_from_tokenizer(tm: Any, obj: Any, vocab_size: int) -> bool:
    """``input_ids`` of this prompt are the tokenizer's own output for its text (no ids, embeddings or
    multimodal items in the request) and that tokenizer cannot emit an id outside the vocabulary."""
    if getattr(obj, "input_ids", None) is not None or getattr(obj, "input_embeds", None) is not None:
        return False
    if not isinstance(getattr(obj, "text", None), str) or obj.contains_mm_input():
        return False
    top = tokenizer_max_id(getattr(tm, "tokenizer", None))
    return top is not None and top < vocab_size


def _check_prompt(obj: Any, input_ids: Any, vocab_size: int, from_tokenizer: bool = False) -> None:
    if input_ids is None:  # input_embeds: no ids reach the embedding
        return
    if len(input_ids) == 0:
        session = obj.session_params if isinstance(getattr(obj, "session_params", None), dict) else {}
        if session.get("id"):  # the session's history supplies the prompt
            return
        source = "text" if getattr(obj, "text", None) is not None else "input_ids"
        raise ValueError(f"{_name(source, obj)} is an empty prompt (0 tokens); at least one token is needed")
    if not from_tokenizer:
        check_token_ids(input_ids, _name("input_ids", obj), vocab_size)


def refuse_hostile_fields(original, self, obj, input_ids, *args, **kwargs):
    from sglang.srt.managers.io_struct import GenerateReqInput

    vocab_size = int(self.model_config.vocab_size)
    if isinstance(obj, GenerateReqInput):
        _check_generate_fields(obj, vocab_size)
        _check_input_embeds(obj, getattr(self.model_config, "hidden_size", None))
    result = original(self, obj, input_ids, *args, **kwargs)
    # After upstream: with --allow-auto-truncate it shortens input_ids in place, and what is
    # left is what reaches the scheduler.
    from_tokenizer = isinstance(obj, GenerateReqInput) and _ids_from_tokenizer(self, obj, vocab_size)
    _check_prompt(obj, input_ids, vocab_size, from_tokenizer)
    if isinstance(obj, GenerateReqInput) and input_ids is not None:
        for field in ("multi_item_delimiter_indices", "token_indices_to_pool"):
            _check_positions(obj, field, len(input_ids))
    return result


# ---------------------------------------------------------------------------
# Internal fields (GenerateReqInput)
# ---------------------------------------------------------------------------

# GenerateReqInput fields outside SGLang's JSON contract (sglang.api.v1.GenerateRequest)
# that SGLang itself fills in. A body can still carry them, and nothing checks their types;
# a string ``received_time``, for one, kills the TokenizerManager's output loop.
_INTERNAL_SCALARS = {
    "received_time": (_is_real, "a number"),
    "http_worker_ipc": (lambda v: isinstance(v, str), "a string"),
    "conversation_id": (lambda v: isinstance(v, str), "a string"),
    "need_wait_for_mm_inputs": (_is_bool, "true or false"),
    "data_parallel_rank": (_is_int, "an integer"),
    "max_dynamic_patch": (_is_int, "an integer"),
    "min_dynamic_patch": (_is_int, "an integer"),
    "image_max_dynamic_patch": (_is_int, "an integer"),
    "video_max_dynamic_patch": (_is_int, "an integer"),
    "video_config": (lambda v: isinstance(v, dict), "an object"),
    "external_trace_header": (lambda v: isinstance(v, dict), "an object"),
    "mm_processor_kwargs": (lambda v: isinstance(v, dict), "an object"),
    "num_items_assigned": (lambda v: isinstance(v, dict), "an object"),
    "encoder_urls": (lambda v: isinstance(v, list) and all(isinstance(u, str) for u in v), "a list of strings"),
}
_INTERNAL_BOOLS = (
    "use_audio_in_video",
    "return_flat_raw_top_logprobs",
    "return_flat_raw_output_top_logprobs",
    "return_flat_raw_top_logprobs_b64",
    "log_metrics",
    "return_routed_experts",
    "return_indexer_topk",
    "background",
    "no_logs",
    "return_bytes",
    "return_entropy",
)
_LOGPROBS_MODES = ("selected", "support")


def _check_internal_fields(obj) -> None:
    for field, (ok, expected) in _INTERNAL_SCALARS.items():
        v = getattr(obj, field, None)
        if v is not None and not ok(v):
            raise ValueError(f"{field} must be {expected}, got {_show(v)}")
    for field in _INTERNAL_BOOLS:
        v = getattr(obj, field, None)
        if v is not None and not _is_bool(v):
            raise ValueError(f"{field} must be true or false, got {_show(v)}")
    # lora_id is the registry's handle, set from lora_path; one sent without lora_path would
    # reach the scheduler and the registry's release untouched.
    if getattr(obj, "lora_id", None) is not None and not getattr(obj, "lora_path", None):
        raise ValueError("lora_id is set by the server from lora_path; send lora_path instead")
    mode = getattr(obj, "sampling_logprobs_mode", None)
    for m in mode if isinstance(mode, list) else [mode]:
        if m is not None and m not in _LOGPROBS_MODES:
            raise ValueError(f"sampling_logprobs_mode must be one of {list(_LOGPROBS_MODES)}, got {_show(m)}")
    overrides = getattr(obj, "positional_embed_overrides", None)
    if overrides is not None:
        from sglang.srt.managers.embed_types import PositionalEmbeds

        items = overrides if isinstance(overrides, list) else [overrides]
        # tensors only come from in-process callers; JSON can never hold one
        if not all(o is None or isinstance(o, PositionalEmbeds) for o in items):
            raise ValueError("positional_embed_overrides can only be passed in process (sglang.Engine), not as JSON")


def _check_positions(obj, field: str, n_tokens: int) -> None:
    v = getattr(obj, field, None)
    if v is None:
        return
    # The logits processor indexes the prefill's hidden states at these positions; only a prompt
    # computed from position 0 has them all (a radix-cache hit would not). SGLang's own scoring
    # sends exactly return_logprob=True, logprob_start_len=0.
    if obj.return_logprob is not True or obj.logprob_start_len != 0:
        raise ValueError(f"{_name(field, obj)} needs return_logprob=true and logprob_start_len=0")
    if not isinstance(v, (list, tuple)) or not all(_is_int(i) for i in v):
        raise ValueError(f"{_name(field, obj)} must be a list of token positions, got {_show(v)}")
    for k, i in enumerate(v):
        if not 0 <= i < n_tokens:
            raise ValueError(f"{_name(field, obj)}[{k}] = {i} is outside the prompt's positions [0, {n_tokens})")


def _check_input_embeds(obj, hidden_size: Optional[int]) -> None:
    embeds = getattr(obj, "input_embeds", None)
    if embeds is None:
        return
    try:
        arr = np.asarray(embeds, dtype=np.float64)
    except (ValueError, TypeError):
        raise ValueError(f"{_name('input_embeds', obj)} must be a list of equal-length lists of numbers") from None
    if arr.ndim != 2 or arr.shape[0] == 0 or (hidden_size and arr.shape[1] != hidden_size):
        raise ValueError(
            f"{_name('input_embeds', obj)} must have shape [tokens >= 1, {hidden_size or 'hidden_size'}], "
            f"got {list(arr.shape)}"
        )
    if not np.isfinite(arr).all():
        raise ValueError(f"{_name('input_embeds', obj)} holds a non-finite number")


# ---------------------------------------------------------------------------
# Batch shape (GenerateReqInput)
# ---------------------------------------------------------------------------

def _num_prompts(obj) -> Optional[int]:
    """Prompts in the request before any ``n`` expansion; None for a single prompt. Mirrors
    ``GenerateReqInput._determine_batch_size``, which runs after this check."""
    try:
        if obj.text is not None:
            return None if isinstance(obj.text, str) else len(obj.text)
        if obj.input_ids is not None:
            ids = obj.input_ids
            return None if len(ids) == 0 or isinstance(ids[0], int) else len(ids)
        if obj.input_embeds is not None:
            return None if isinstance(obj.input_embeds[0][0], float) else len(obj.input_embeds)
    except (TypeError, IndexError, KeyError):
        pass  # malformed; normalization names the problem
    return None


# Top-level strings that are tokenized, hashed into cache keys or echoed in the response.
_TEXT_FIELDS = ("text", "rid", "extra_key", "cache_salt", "lora_path", "routing_key", "session_id")


def _check_batch_shape(obj) -> None:
    for field in _TEXT_FIELDS:
        check_utf8(getattr(obj, field, None), field)
    if obj.text is not None:
        texts = obj.text if isinstance(obj.text, list) else [obj.text]
        if isinstance(obj.text, list) and not obj.text:
            raise ValueError("text is an empty list; send at least one prompt")
        for i, t in enumerate(texts):
            if not isinstance(t, str):
                where = f"text[{i}]" if isinstance(obj.text, list) else "text"
                raise ValueError(f"{where} must be a string, got {_show(t)}")
    elif obj.input_ids is not None and not isinstance(obj.input_ids, list) and not hasattr(obj.input_ids, "tolist"):
        raise ValueError(f"input_ids must be a list of token ids or a list of such lists, got {_show(obj.input_ids)}")

    sp = obj.sampling_params
    n_prompts = _num_prompts(obj)
    if isinstance(sp, list):
        if not sp:
            raise ValueError("sampling_params is an empty list")
        for i, p in enumerate(sp):
            if not isinstance(p, dict):
                raise ValueError(f"sampling_params[{i}] must be an object, got {_show(p)}")
    elif sp is not None and not isinstance(sp, dict):
        raise ValueError(f"sampling_params must be an object or a list of objects, got {_show(sp)}")
    first = sp[0] if isinstance(sp, list) else (sp or {})
    n = first.get("n", 1)
    if not _is_int(n) or n < 1:
        raise ValueError(f"sampling_params.n = {_show(n)} must be a positive integer")
    if n > 1 and n * (n_prompts or 1) > MAX_SEQUENCES:
        raise ValueError(
            f"sampling_params.n = {n} for {n_prompts or 1} prompt(s) asks for {n * (n_prompts or 1)} sequences; "
            f"at most {MAX_SEQUENCES} per request"
        )
    rid = obj.rid
    if rid is not None:
        rids = rid if isinstance(rid, list) else [rid]
        if not all(isinstance(r, str) for r in rids):
            raise ValueError(f"rid must be a string or a list of strings, got {_show(rid)}")
        # A single prompt's rid keys the TokenizerManager's request table (a list would be a 500).
        if isinstance(rid, list) and n_prompts is None and n == 1:
            raise ValueError("rid must be a string (not a list) for a single prompt")
    if isinstance(sp, list):
        expected = 1 if n_prompts is None else n_prompts
        if len(sp) != expected:
            raise ValueError(
                f"sampling_params has {len(sp)} entries for {expected} prompt(s); send one object, "
                "or one per prompt"
            )
        if n_prompts is None and n == 1:
            raise ValueError("sampling_params must be an object (not a list) for a single prompt")


def check_shared_sampling_params_once(original, self, *args, **kwargs):
    # Before anything else in generate_request reads the request (its state is made next).
    _check_internal_fields(self)
    _check_batch_shape(self)
    try:
        return original(self, *args, **kwargs)
    except (TypeError, IndexError, KeyError, AttributeError) as e:
        raise ValueError(f"malformed request: {type(e).__name__}: {e}") from None


def keep_batch_index(original, self, i):
    try:
        sub = original(self, i)
    except (TypeError, IndexError, KeyError, AttributeError) as e:
        raise ValueError(
            f"the per-prompt lists of this batch do not match its {getattr(self, 'batch_size', '?')} prompts "
            f"(prompt {i}: {type(e).__name__}: {e})"
        ) from None
    try:
        setattr(sub, _BATCH_INDEX, i)
        setattr(sub, _CHECKED_SP, self.__dict__.setdefault(_CHECKED_SP, {}))
    except AttributeError:  # pragma: no cover - slotted request types
        pass
    return sub


@functools.cache  # once per process, whichever process kinds install it
def install_input_guard() -> None:
    register(f"{_TM}._validate_one_request", refuse_hostile_fields, "around")
    register(f"{_GRI}.normalize_batch_and_arguments", check_shared_sampling_params_once, "around")
    register(f"{_GRI}.__getitem__", keep_batch_index, "around")
