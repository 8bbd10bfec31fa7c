"""Test stand-in for slime's rollout process around R3: from a /generate response to the rollout_data a trainer gets.

slime is not on PyPI; this re-implements (not copies) what R3's samples go through in slime's rollout process,
from the public source of THUDM/slime at commit 624b824 (``slime_reference.SLIME_COMMIT``):

* ``slime/utils/misc.py``: ``decode_int32_meta_array`` (base64 text, bytes, tensor or list to a flat int32
  tensor; None when the key is absent or null). ``load_function`` is ``slime_actor_reference``'s.
* ``slime/utils/types.py``: ``Sample`` (the fields the R3 path reads; ``to_dict`` copies ``__dict__``,
  ``from_dict`` sets keys that are not fields as attributes), ``append_response_tokens`` (tokens, loss mask,
  log probabilities, then ``_apply_meta_info`` when a ``meta_info`` is given) and ``_apply_meta_info``:
  ``routed_experts`` decoded, its element count checked against ``len(tokens) - 1 - routed_experts_start_len``
  rows of ``--num-layers`` x ``--moe-router-topk``, reshaped with them, kept whole (start 0) or joined after the
  first ``start`` existing rows; at a finished response (``finish_reason``), ``weight_version`` appended to
  ``weight_versions`` and the status set. Nothing else of ``meta_info`` is kept (``routing_error`` is not).
* ``slime/rollout/base_types.py``: ``RolloutFnTrainOutput``, ``RolloutFnEvalOutput``, ``call_rollout_fn``.
* ``slime/rollout/sglang_rollout.py``: ``generate`` (payload ``sampling_params`` and ``return_logprob``,
  ``return_routed_experts`` under ``--use-rollout-routing-replay``, ``input_ids``; ``sample.tokens`` set to the
  prompt ids when empty; the response's ``output_token_logprobs`` and ``meta_info`` into
  ``append_response_tokens``), ``generate_and_rm``'s choice of ``--custom-generate-function-path`` and
  ``generate_rollout`` (``evaluation``: the eval output; else the training groups sorted by index).
* ``slime/observability/rollout_data_utils.py``: ``validate_rollout_routed_experts_for_replay`` and
  ``tensorize_rollout_data_for_training`` (tokens to int64, loss masks to int32, log probs to float32).
* ``slime/ray/rollout.py``: ``RolloutManager.__init__`` (``load_function`` of ``--rollout-function-path`` and
  ``--eval-function-path``, defaulting to the former), ``generate`` (``_get_rollout_data``: ``call_rollout_fn``
  and the flattening of nested groups; ``_convert_samples_to_train_data``; ``_split_train_data_by_dp``),
  ``eval``; of the conversion the keys the R3 path and the trainer stand-in read, with the ``rollout_routed_experts``
  block as slime has it: ``torch.as_tensor`` of every sample's rows when the first sample has rows, else none.

Deviations (no Ray, no HTTP, no tokenizer, no reward model): ``post`` answers from ``SERVER``, a function of the
payload set by the test (sglang-r3's own response builder makes the ``meta_info``); a prompt is its token ids;
the reward is 1.0; no dynamic filter, abort or partial rollout; one data-parallel rank, its schedule
(``micro_batch_indices``, ``num_microbatches``) given to ``RolloutManager``; ``eval`` generates the given groups.
``install_rollout()`` registers this module under slime's module names (after ``slime_reference.install()`` and
``slime_actor_reference.install_actor()``).
"""

from __future__ import annotations

import asyncio
import sys
from dataclasses import dataclass, field
from enum import Enum
from typing import Any, Callable, Dict, List, Optional

import pybase64
import torch

import slime_actor_reference as sar

MODULE_NAMES = (
    "slime.utils.types",
    "slime.rollout",
    "slime.rollout.base_types",
    "slime.rollout.sglang_rollout",
    "slime.ray",
    "slime.ray.rollout",
    "slime.observability.rollout_data_utils",
)

SERVER: Optional[Callable[[Dict[str, Any]], Dict[str, Any]]] = None  # the rollout server's /generate


# -- slime/utils/misc.py --------------------------------------------------------------------------------------

def decode_int32_meta_array(meta_info, keys):
    for key in (keys,) if isinstance(keys, str) else keys:
        if key in meta_info:
            value = meta_info[key]
            break
    else:
        return None
    if value is None:
        return None
    if isinstance(value, str):
        value = pybase64.b64decode(value.encode("ascii"))
    if isinstance(value, (bytes, bytearray, memoryview)):
        return torch.frombuffer(bytearray(value), dtype=torch.int32)
    if torch.is_tensor(value):
        return value.detach().to(device="cpu", dtype=torch.int32).reshape(-1)
    return torch.as_tensor(value, dtype=torch.int32).reshape(-1)


# -- slime/utils/types.py ---------------------------------------------------------------------------------------

@dataclass
class Sample:
    group_index: Optional[int] = None
    index: Optional[int] = None
    rollout_id: Optional[int] = None
    prompt: Any = ""
    tokens: List[int] = field(default_factory=list)
    response: str = ""
    response_length: int = 0
    reward: Any = None
    loss_mask: Optional[List[int]] = None
    weight_versions: List[str] = field(default_factory=list)
    rollout_log_probs: Optional[List[float]] = None
    rollout_routed_experts: Any = None
    remove_sample: bool = False

    class Status(Enum):
        PENDING = "pending"
        COMPLETED = "completed"
        TRUNCATED = "truncated"
        ABORTED = "aborted"
        FAILED = "failed"

    status: Status = Status.PENDING
    metadata: dict = field(default_factory=dict)
    train_metadata: Optional[dict] = None

    def to_dict(self):
        value = self.__dict__.copy()
        value["status"] = self.status.value
        return value

    @staticmethod
    def from_dict(data):
        data = dict(data)
        data["status"] = Sample.Status(data["status"])
        names = set(Sample.__dataclass_fields__)
        sample = Sample(**{k: v for k, v in data.items() if k in names})
        for key, value in data.items():
            if key not in names:
                setattr(sample, key, value)
        return sample

    def append_response_tokens(self, args=None, *, tokens=None, log_probs=None, trainable=True, meta_info=None,
                               text=None, update_terminal_info=True):
        tokens = [int(t) for t in (tokens or [])]
        log_probs = None if log_probs is None else [float(x) for x in log_probs]
        if log_probs is not None and len(log_probs) != len(tokens):
            raise ValueError(f"log_probs length {len(log_probs)} != tokens length {len(tokens)}")
        if tokens and trainable and log_probs is None:
            raise ValueError("trainable response tokens require rollout log probabilities.")
        if tokens and not trainable:
            log_probs = [0.0] * len(tokens)
        if text is not None:
            self.response += text
        before = self.response_length
        if tokens:
            self.tokens += tokens
            self.response_length += len(tokens)
            if self.loss_mask is None:
                self.loss_mask = [1] * before
            self.loss_mask += [1 if trainable else 0] * len(tokens)
        if log_probs is not None:
            if self.rollout_log_probs is None:
                self.rollout_log_probs = [0.0] * before
            self.rollout_log_probs += log_probs
        if meta_info is not None:
            self._apply_meta_info(args, meta_info, new_token_count=len(tokens),
                                  update_terminal_info=update_terminal_info)

    def _apply_meta_info(self, args, meta_info, *, new_token_count=0, pad_missing_top_p=False,
                         update_terminal_info=True):
        routed = decode_int32_meta_array(meta_info, "routed_experts")
        if routed is not None:
            start = int(meta_info.get("routed_experts_start_len", 0) or 0)
            if start < 0:
                raise ValueError(f"SGLang routed_experts_start_len must be non-negative, got {start}.")
            rows = max(0, len(self.tokens) - 1 - start)
            if routed.numel() != rows * args.num_layers * args.moe_router_topk:
                raise ValueError(
                    f"SGLang routed_experts element count does not match sample tokens: got={routed.numel()}, "
                    f"expected={rows * args.num_layers * args.moe_router_topk} (tokens={len(self.tokens)}, "
                    f"routed_experts_start_len={start}, num_layers={args.num_layers}, "
                    f"moe_router_topk={args.moe_router_topk})."
                )
            routed = routed.reshape(rows, args.num_layers, args.moe_router_topk)
            if start == 0:
                self.rollout_routed_experts = routed
            else:
                existing = self.rollout_routed_experts
                if existing is None:
                    raise ValueError("Cannot append partial routed experts without existing routed experts "
                                     f"(routed_experts_start_len={start}).")
                existing = torch.as_tensor(existing, dtype=routed.dtype)
                if existing.shape[0] < start:
                    raise ValueError("Existing routed experts shorter than routed_experts_start_len.")
                self.rollout_routed_experts = torch.cat([existing[:start], routed], dim=0)
        if not update_terminal_info or "finish_reason" not in meta_info:
            return
        if "weight_version" in meta_info:
            self.weight_versions.append(meta_info["weight_version"])
        self.status = {"length": Sample.Status.TRUNCATED, "abort": Sample.Status.ABORTED,
                       "stop": Sample.Status.COMPLETED}.get(meta_info["finish_reason"]["type"], self.status)


# -- slime/rollout/base_types.py --------------------------------------------------------------------------------

@dataclass
class RolloutFnTrainOutput:
    samples: list
    metrics: Optional[dict] = None


@dataclass
class RolloutFnEvalOutput:
    data: dict
    metrics: Optional[dict] = None


def call_rollout_fn(fn, *args, evaluation: bool, **kwargs):
    output = fn(*args, **kwargs, evaluation=evaluation)
    if not isinstance(output, (RolloutFnTrainOutput, RolloutFnEvalOutput)):
        output = RolloutFnEvalOutput(data=output) if evaluation else RolloutFnTrainOutput(samples=output)
    return output


# -- slime/rollout/sglang_rollout.py ----------------------------------------------------------------------------

async def post(url, payload, headers=None):
    return SERVER(payload)


async def generate(args, sample, sampling_params):
    prompt_ids = list(sample.tokens) if sample.tokens else list(sample.prompt)  # deviation: no tokenizer
    payload = {"sampling_params": dict(sampling_params), "return_logprob": True}
    if args.use_rollout_routing_replay:
        payload["return_routed_experts"] = True
    payload["input_ids"] = prompt_ids
    if not sample.tokens:
        sample.tokens = prompt_ids
    output = await post("http://router/generate", payload)
    meta = output["meta_info"]
    pairs = meta.get("output_token_logprobs") or []
    sample.append_response_tokens(args, tokens=[p[1] for p in pairs], log_probs=[p[0] for p in pairs],
                                  trainable=True, meta_info=meta, text=output["text"])
    return sample


async def generate_and_rm(args, sample, sampling_params, evaluation=False):
    path = getattr(args, "custom_generate_function_path", None)
    if path is not None:
        sample = await sar.load_function(path)(args, sample, sampling_params)
    else:
        sample = await generate(args, sample, sampling_params)
    if sample.reward is None:
        sample.reward = 1.0  # deviation: no reward model
    return sample


async def _generate_groups(args, groups, evaluation):
    params = {"max_new_tokens": 8, "temperature": 1.0}
    return await asyncio.gather(*[
        asyncio.gather(*[generate_and_rm(args, s, dict(params), evaluation) for s in group]) for group in groups
    ])


def generate_rollout(args, rollout_id, data_source, evaluation=False):
    groups = [list(g) for g in asyncio.run(_generate_groups(args, data_source(rollout_id), evaluation))]
    if evaluation:
        return RolloutFnEvalOutput(data={"eval": {"samples": [s for g in groups for s in g]}})
    return RolloutFnTrainOutput(samples=sorted(groups, key=lambda g: g[0].index))


# -- slime/observability/rollout_data_utils.py ------------------------------------------------------------------

_TENSOR_DTYPES = {"tokens": torch.long, "loss_masks": torch.int, "rollout_log_probs": torch.float32,
                  "rollout_routed_experts": None}


def tensorize_rollout_data_for_training(rollout_data):
    for key, dtype in _TENSOR_DTYPES.items():
        if key in rollout_data:
            rollout_data[key] = [torch.as_tensor(v, dtype=dtype).detach().cpu().contiguous() if dtype is not None
                                 else torch.as_tensor(v).detach().cpu().contiguous() for v in rollout_data[key]]


def validate_rollout_routed_experts_for_replay(routed_experts, args):
    if not routed_experts:
        raise ValueError("R3 is enabled but no rollout routed-experts tensors were returned.")
    num_layers, topk = int(args.num_layers), int(args.moe_router_topk)
    freq = getattr(args, "moe_layer_freq", None)
    moe_layers = ([i for i, f in enumerate(freq[:num_layers]) if int(f) != 0] if isinstance(freq, (list, tuple))
                  else list(range(num_layers)))
    for i, experts in enumerate(routed_experts):
        experts = torch.as_tensor(experts)
        if experts.ndim != 3 or tuple(experts.shape[1:]) != (num_layers, topk):
            raise ValueError(f"Invalid rollout routed-experts shape for R3: sample={i}, got={tuple(experts.shape)}, "
                             f"expected=(*, {num_layers}, {topk}).")
        if experts.shape[0] == 0:
            raise ValueError(f"R3 sample {i} has no routed-experts rows.")
        if topk > 1:
            missing = [l for l in moe_layers if not torch.count_nonzero(experts[:, l, :])]
            if missing:
                raise ValueError(f"R3 routed-experts capture is all zero for MoE layers {missing} in sample {i}. "
                                 "This usually means SGLang pipeline stages did not aggregate their disjoint routing "
                                 "captures; refusing to replay expert 0 everywhere.")


# -- slime/ray/rollout.py ---------------------------------------------------------------------------------------

class RolloutManager:
    def __init__(self, args, data_source, micro_batch_indices, num_microbatches):
        self.args, self.data_source = args, data_source
        self.schedule = ([list(m) for m in micro_batch_indices], list(num_microbatches))
        self.generate_rollout = sar.load_function(args.rollout_function_path)
        self.eval_generate_rollout = sar.load_function(args.eval_function_path or args.rollout_function_path)

    def generate(self, rollout_id):
        data = self._get_rollout_data(rollout_id)
        return self._split_train_data_by_dp(self._convert_samples_to_train_data(data))

    def eval(self, rollout_id):
        return call_rollout_fn(self.eval_generate_rollout, self.args, rollout_id, self.data_source, evaluation=True)

    def _get_rollout_data(self, rollout_id):
        data = call_rollout_fn(self.generate_rollout, self.args, rollout_id, self.data_source, evaluation=False)
        data = data.samples
        while isinstance(data[0], list):
            data = [s for group in data for s in group]
        return data

    def _convert_samples_to_train_data(self, samples):
        rewards = [s.reward for s in samples]
        train_data = {
            "tokens": [s.tokens for s in samples],
            "response_lengths": [s.response_length for s in samples],
            "rewards": rewards,
            "raw_reward": rewards,
            "truncated": [1 if s.status == Sample.Status.TRUNCATED else 0 for s in samples],
            "sample_indices": [s.index for s in samples],
            "rollout_ids": [s.rollout_id if s.rollout_id is not None else s.index for s in samples],
        }
        for s in samples:
            if s.loss_mask is None:
                s.loss_mask = [1] * s.response_length
        train_data["loss_masks"] = [s.loss_mask for s in samples]
        if samples[0].rollout_log_probs is not None:
            train_data["rollout_log_probs"] = [s.rollout_log_probs for s in samples]
        if samples[0].rollout_routed_experts is not None:
            routed_experts = [torch.as_tensor(s.rollout_routed_experts) for s in samples]
            if getattr(self.args, "use_rollout_routing_replay", False):
                validate_rollout_routed_experts_for_replay(routed_experts, self.args)
            train_data["rollout_routed_experts"] = routed_experts
        if samples[0].train_metadata is not None:
            train_data["metadata"] = [s.train_metadata for s in samples]
        return train_data

    def _split_train_data_by_dp(self, data):
        """One data-parallel rank: its partition is every sample, its schedule the one given."""
        data["total_lengths"] = [len(t) for t in data["tokens"]]
        partition = list(range(len(data["tokens"])))
        micro_batch_indices, num_microbatches = self.schedule
        rollout_data = {"partition": partition}
        for key in ("tokens", "response_lengths", "rewards", "truncated", "loss_masks", "sample_indices",
                    "rollout_ids", "rollout_log_probs", "rollout_routed_experts"):
            if key in data:
                rollout_data[key] = [data[key][j] for j in partition]
        for key in ("raw_reward", "total_lengths"):
            rollout_data[key] = data[key]
        sizes, at = [], 0
        for n in num_microbatches:  # one training step per entry, of that many microbatches
            sizes.append(sum(len(m) for m in micro_batch_indices[at : at + n]))
            at += n
        rollout_data["global_batch_sizes"] = sizes
        rollout_data["num_microbatches"] = num_microbatches
        rollout_data["micro_batch_indices"] = micro_batch_indices
        tensorize_rollout_data_for_training(rollout_data)
        return rollout_data


def rollout_args(**overrides):
    """The actor's arguments (``slime_actor_reference.default_args``) plus what the rollout path reads."""
    kw = dict(rollout_function_path="slime.rollout.sglang_rollout.generate_rollout", eval_function_path=None,
              custom_generate_function_path=None, num_layers=4, moe_router_topk=4, moe_layer_freq=[0, 1, 1, 1])
    kw.update(overrides)
    return sar.default_args(**kw)


def install_rollout() -> Callable[[], None]:
    """Answer to slime's rollout-side module names; returns the undo (which also gives ``Sample`` its own
    ``_apply_meta_info`` back)."""
    this = sys.modules[__name__]
    saved = {n: sys.modules.get(n) for n in MODULE_NAMES}
    apply_meta_info = Sample._apply_meta_info
    for name in MODULE_NAMES:
        sys.modules[name] = this
    sar.load_function.cache_clear()

    def undo() -> None:
        Sample._apply_meta_info = apply_meta_info
        sar.load_function.cache_clear()
        for n, m in saved.items():
            if m is None:
                sys.modules.pop(n, None)
            else:
                sys.modules[n] = m

    return undo
