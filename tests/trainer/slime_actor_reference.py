"""Test stand-in for slime's trainer process around R3: the extension points and the order of a training step.

slime is not on PyPI; this re-implements (not copies) what ``sglang_r3.trainer.slime.install`` meets in
slime, from the public source of THUDM/slime at commit 624b824 (``slime_reference.SLIME_COMMIT``):

* ``slime/utils/misc.py``: ``load_function(path)`` (cached; ``module.attr`` by ``importlib``).
* ``slime/backends/megatron_utils/initialize.py``: ``init(args)`` ends with
  ``load_function(args.custom_megatron_init_path)(args)`` when the flag is set (process groups and seeds are
  set up before it; here ``megatron_cpu`` has done that).
* ``slime/backends/megatron_utils/data.py``: ``DataIterator`` (``get_next(keys)`` returns each key's values at
  the current micro-batch's indices, or None for an absent key, and advances; ``reset``) and
  ``get_data_iterator`` (one per virtual pipeline stage, all over the same schedule).
* ``slime/backends/megatron_utils/actor.py``: ``MegatronTrainRayActor.init`` (``init(args)``, then the model
  is built), ``fill_routing_replay`` (slime's positional loop, ``slime_reference.slime_positional_fill``, then
  ``del rollout_data["rollout_routed_experts"]``), ``compute_log_prob`` and ``train_actor``'s R3 order: the
  fill (``self.fill_routing_replay``, looked up on the class), ``replay_forward`` and the log-prob pass unless
  slime reuses the training forward's log-probs (its ``can_reuse_log_probs_in_loss``), ``clear_all_forward``,
  ``log_rollout_data``, ``replay_backward`` and ``train``, ``RoutingReplay.clear_all()``.
* ``slime/observability/train_metric_utils.py``: ``log_rollout_data``'s walk over the keys of ``rollout_data``
  (its ignored keys; every other per-sample list is averaged).
* ``slime/backends/megatron_utils/model.py``: ``forward_only`` (eval mode, ``labels=None``, no ``mtp_kwargs``,
  one schedule per step), ``train_one_step`` (the before-train-step hook, ``replay_forward`` around the model
  call only, ``mtp_kwargs={"mtp_labels": tokens}`` with ``--enable-mtp-training``, the loss dict on the last
  pipeline stage) and ``train`` (iterators reset, train mode, ``train_one_step`` called by name per step, the
  per-head MTP losses, ``log_dict`` of ``train/...`` keys on the logging rank, ``logging_utils.log``).
* ``slime/observability/logging_utils.py``: ``configure_logger`` (the root logger at INFO in slime's format) and
  ``log(args, metrics, step_key)`` (wandb / tensorboard; here the dicts are kept in ``LOGGED``).
* ``docker/patch/latest/megatron.patch``, its ``gpt_model.py`` hunk: ``GPTModel.forward`` takes ``mtp_kwargs``
  and the MTP block runs (and its loss is taken) only when ``mtp_kwargs`` carries ``mtp_labels``.

Deviations (CPU, no slime): one process, tensor parallel 1; samples are packed as slime's THD packing does
(positions restart per sample, attention within a sample) with a dense mask instead of ``packed_seq_params``;
the loss is the mean output (the routing, not the loss, is under test); the optimizer does not step; megatron's
0.16.1 MTP loss takes ``labels = roll(mtp_labels, -1)``, which is what the hunk computes from ``mtp_labels``.
``install_actor()`` registers this one module under each of slime's module names above.
"""

from __future__ import annotations

import functools
import importlib
import os
import sys
import types
from typing import Any, Callable, Dict, List, Optional, Sequence

import torch

import slime_reference
from megatron_cpu import causal_mask

STAGE = "ROUTING_REPLAY_STAGE"
MODULE_NAMES = (
    "slime.utils.misc",
    "slime.backends",
    "slime.backends.megatron_utils",
    "slime.backends.megatron_utils.initialize",
    "slime.backends.megatron_utils.data",
    "slime.backends.megatron_utils.actor",
    "slime.backends.megatron_utils.model",
    "slime.observability",
    "slime.observability.logging_utils",
)

BUILD_MODEL: Optional[Callable[[Any], list]] = None  # what initialize_model_and_optimizer builds (set by the test)
LOGGED: List[Dict[str, Any]] = []  # every dict logging_utils.log was given


# -- slime/utils/misc.py ----------------------------------------------------------------------------------

@functools.lru_cache(maxsize=None)
def load_function(path):
    module_path, _, attr = path.rpartition(".")
    return getattr(importlib.import_module(module_path), attr)


# -- slime/backends/megatron_utils/initialize.py: init(args), its last statement --------------------------

def init(args) -> None:
    if getattr(args, "custom_megatron_init_path", None):
        custom_init = load_function(args.custom_megatron_init_path)
        custom_init(args)


# -- slime/backends/megatron_utils/data.py ----------------------------------------------------------------

class DataIterator:
    def __init__(self, rollout_data, micro_batch_indices):
        self.rollout_data = rollout_data
        self.micro_batch_indices = micro_batch_indices
        self.offset = 0

    def get_next(self, keys):
        batch = {}
        indices = self.micro_batch_indices[self.offset]
        for key in keys:
            vals = self.rollout_data.get(key, None)
            batch[key] = None if vals is None else [vals[i] for i in indices]
        self.offset += 1
        return batch

    def reset(self):
        self.offset = 0
        return self


def get_data_iterator(rollout_data) -> List[DataIterator]:
    from megatron.core import parallel_state as mpu

    vpp_size = mpu.get_virtual_pipeline_model_parallel_world_size() or 1
    return [DataIterator(rollout_data, rollout_data["micro_batch_indices"]) for _ in range(vpp_size)]


# -- slime/observability/logging_utils.py -----------------------------------------------------------------

def configure_logger(prefix: str = "") -> None:
    """slime's logging, set up by ``TrainRayActor.__init__`` (and the rollout manager, and argument parsing)
    before anything else runs: the root logger at INFO, slime's format, ``force=True``. Every library logger
    that propagates (ours: ``sglang_r3.trainer.slime``) is printed through it at INFO and above. (slime guards
    it with a once-per-process flag; the tests call it where they restore the root logger themselves.)"""
    import logging

    logging.basicConfig(
        level=logging.INFO,
        format=f"[%(asctime)s{prefix}] %(filename)s:%(lineno)d - %(message)s",
        datefmt="%Y-%m-%d %H:%M:%S",
        force=True,
    )


def log(args, metrics, step_key: str) -> None:
    LOGGED.append(dict(metrics))


# -- megatron.patch gpt_model.py hunk: MTP only with mtp_kwargs["mtp_labels"] -------------------------------

def _apply_gpt_model_hunk() -> Callable[[], None]:
    from megatron.core.models.gpt.gpt_model import GPTModel

    forward, postprocess = GPTModel.forward, GPTModel._postprocess

    def patched_forward(self, *args, mtp_kwargs=None, **kwargs):
        self._slime_mtp_labels = (mtp_kwargs or {}).get("mtp_labels")
        try:
            return forward(self, *args, **kwargs)
        finally:
            self._slime_mtp_labels = None

    def patched_postprocess(self, *args, labels=None, mtp_in_postprocess=None, **kwargs):
        mtp_labels = getattr(self, "_slime_mtp_labels", None)
        if mtp_labels is not None:  # megatron 0.16.1 rolls labels per head; the hunk rolls mtp_labels once first
            return postprocess(self, *args, labels=torch.roll(mtp_labels, -1, -1), mtp_in_postprocess=mtp_in_postprocess,
                               **kwargs)
        saved = self.config.mtp_num_layers
        self.config.mtp_num_layers = None  # the hunk's `if self.config.mtp_num_layers and mtp_labels is not None`
        try:
            return postprocess(self, *args, labels=labels, mtp_in_postprocess=False, **kwargs)
        finally:
            self.config.mtp_num_layers = saved

    GPTModel.forward, GPTModel._postprocess = patched_forward, patched_postprocess

    def undo():
        GPTModel.forward, GPTModel._postprocess = forward, postprocess

    return undo


# -- slime/backends/megatron_utils/model.py ----------------------------------------------------------------

def _packed(tokens: Sequence[torch.Tensor]):
    ids = torch.cat(list(tokens)).reshape(1, -1)
    S = ids.shape[1]
    sample = torch.repeat_interleave(torch.arange(len(tokens)), torch.tensor([len(t) for t in tokens]))
    mask = causal_mask(S) | (sample[:, None] != sample[None, :])[None, None]
    pos = torch.cat([torch.arange(len(t)) for t in tokens]).reshape(1, S)
    return ids, pos, mask


def get_batch(data_iterator, keys):
    batch = data_iterator.get_next(keys)
    batch["input_ids"], batch["position_ids"], batch["attention_mask"] = _packed(batch["tokens"])
    return batch


def _schedule(args, model, data_iterator, forward_step, num_microbatches: int, forward_only_: bool):
    from megatron.core.pipeline_parallel import get_forward_backward_func

    return get_forward_backward_func()(
        forward_step_func=forward_step, data_iterator=data_iterator, model=model,
        num_microbatches=num_microbatches, seq_length=args.seq_length, micro_batch_size=1,
        forward_only=forward_only_,
    )


def forward_only(args, model, data_iterator, num_microbatches):
    for iterator in data_iterator:
        iterator.reset()

    def forward_step(data_iterator, model):
        batch = get_batch(data_iterator, ["tokens"])
        out = model(batch["input_ids"], batch["position_ids"], batch["attention_mask"], labels=None)
        return out, lambda o: (o.float().mean(), {"logits_mean": o.float().mean().detach()})

    for model_module in model:
        model_module.eval()
    with torch.no_grad():
        for step_id in range(len(num_microbatches)):
            _schedule(args, model, data_iterator, forward_step, num_microbatches[step_id], True)
    for model_module in model:
        model_module.train()


def train_one_step(args, rollout_id, step_id, data_iterator, model, optimizer, opt_param_scheduler,
                   num_microbatches, step_global_batch_size):
    from megatron.core import parallel_state as mpu

    for model_chunk in model:
        model_chunk.zero_grad()
    if args.custom_megatron_before_train_step_hook_path:
        hook = load_function(args.custom_megatron_before_train_step_hook_path)
        hook(args, rollout_id, step_id, model, optimizer, opt_param_scheduler)

    def forward_step(data_iterator, model):
        batch = get_batch(data_iterator, ["tokens"])
        if os.environ.get("ENABLE_ROUTING_REPLAY", "0") == "1":
            old_stage = os.environ[STAGE]
            os.environ[STAGE] = "replay_forward"
        kwargs = {"labels": None}
        if args.enable_mtp_training:
            kwargs["mtp_kwargs"] = {"mtp_labels": batch["input_ids"]}
        output = model(batch["input_ids"], batch["position_ids"], batch["attention_mask"], **kwargs)
        if os.environ.get("ENABLE_ROUTING_REPLAY", "0") == "1":
            os.environ[STAGE] = old_stage
        return output, lambda o: (o.float().mean(), {"loss": o.float().mean().detach()})

    losses = _schedule(args, model, data_iterator, forward_step, num_microbatches, False)
    for model_chunk in model:
        model_chunk.zero_grad()
    if mpu.is_pipeline_last_stage(ignore_virtual=True):
        return {"loss": torch.stack([d["loss"] for d in losses]).mean()}, 0.0
    return {}, 0.0


def train(rollout_id, model, optimizer, opt_param_scheduler, data_iterator, num_microbatches, global_batch_sizes):
    from megatron.core import parallel_state as mpu

    args = ARGS[0]
    for iterator in data_iterator:
        iterator.reset()
    for model_module in model:
        model_module.train()
    for step_id in range(len(num_microbatches)):
        loss_dict, grad_norm = train_one_step(  # by name: a module attribute at call time
            args, rollout_id, step_id, data_iterator, model, optimizer, opt_param_scheduler,
            num_microbatches[step_id], global_batch_sizes[step_id],
        )
        mtp_log = {}
        if args.enable_mtp_training:
            mtp_log = slime_reference.slime_mtp_log(num_microbatches[step_id])
        if (
            mpu.get_data_parallel_rank(with_context_parallel=True) == 0
            and mpu.get_tensor_model_parallel_rank() == 0
            and mpu.get_pipeline_model_parallel_rank() == mpu.get_pipeline_model_parallel_world_size() - 1
        ):
            log_dict = {
                f"train/{key}": val.mean().item() if isinstance(val, torch.Tensor) else val
                for key, val in loss_dict.items()
            }
            log_dict["train/grad_norm"] = grad_norm
            log_dict.update(mtp_log)
            log_dict["train/global_batch_size"] = global_batch_sizes[step_id]
            log_dict["train/step"] = rollout_id * len(num_microbatches) + step_id
            log(args, log_dict, step_key="train/step")  # logging_utils.log


ARGS: List[Any] = []  # megatron's get_args()


# -- slime/observability/train_metric_utils.py: log_rollout_data's walk over rollout_data -------------------

_LOG_ROLLOUT_IGNORED = {
    "tokens", "multimodal_train_inputs", "loss_masks", "sample_indices", "rollout_ids", "rollout_mask_sums",
    "rollout_top_p_token_ids", "rollout_top_p_token_offsets", "rollout_routed_experts", "global_batch_sizes",
    "num_microbatches", "micro_batch_indices", "source_names", "local_raw_reward",
}


def log_rollout_data(rollout_id, args, rollout_data) -> Dict[str, Any]:
    """Every other key is averaged: a list of tensors by its mean, any other list by ``sum(value)`` (so a
    list of dicts raises TypeError), a tensor by its mean, anything else raises ValueError."""
    out = {}
    for key, value in rollout_data.items():
        if key in _LOG_ROLLOUT_IGNORED:
            continue
        if isinstance(value, (list, tuple)):
            out[key] = torch.cat(value).float().mean().item() if isinstance(value[0], torch.Tensor) else sum(value)
        elif isinstance(value, torch.Tensor):
            out[key] = value.float().mean().item()
        else:
            raise ValueError(f"Unsupported type: {type(value)} for key: {key}")
    return out


# -- slime/backends/megatron_utils/actor.py ----------------------------------------------------------------

class MegatronTrainRayActor:
    def init(self, args, role: str = "actor") -> int:
        self.args, self.role = args, role
        ARGS[:] = [args]
        init(args)
        self.model = BUILD_MODEL(args)  # initialize_model_and_optimizer: after init, so after the hook
        self.optimizer = self.opt_param_scheduler = None
        return 0

    def fill_routing_replay(self, data_iterator, num_microbatches, rollout_data):
        """slime's own: positional (``slime_reference.slime_positional_fill``), raises with MTP routers."""
        if "rollout_routed_experts" not in rollout_data:
            raise ValueError(
                "rollout_routed_experts is required in rollout_data when use_rollout_routing_replay is set."
            )
        for iterator in data_iterator:
            iterator.reset()
        microbatches = []
        for _ in range(sum(num_microbatches)):
            batch = data_iterator[0].get_next(["rollout_routed_experts", "tokens"])
            microbatches.append((batch["rollout_routed_experts"], batch["tokens"]))
        slime_reference.slime_positional_fill(self.model, microbatches, self.args.num_experts)
        del rollout_data["rollout_routed_experts"]
        for iterator in data_iterator:
            iterator.reset()

    def compute_log_prob(self, data_iterator, num_microbatches, store_prefix=""):
        forward_only(self.args, self.model, data_iterator, num_microbatches)
        return {}

    def train_actor(self, rollout_id: int, rollout_data) -> None:
        args = self.args
        data_iterator = get_data_iterator(rollout_data)
        num_microbatches = rollout_data["num_microbatches"]
        global_batch_sizes = rollout_data["global_batch_sizes"]
        if args.use_rollout_routing_replay:
            self.fill_routing_replay(data_iterator, num_microbatches, rollout_data)
        can_reuse_log_probs_in_loss = (
            len(num_microbatches) == 1 and args.loss_type == "policy_loss" and args.kl_coef == 0
            and not args.use_rollout_logprobs and not args.get_mismatch_metrics and not args.use_critic
            and not args.keep_old_actor and not args.use_opd
            and (not args.use_routing_replay or args.use_rollout_routing_replay)
            and args.advantage_estimator != "gspo"
        )
        if (not args.use_rollout_logprobs or args.get_mismatch_metrics) and not can_reuse_log_probs_in_loss:
            if args.use_routing_replay:
                os.environ[STAGE] = "replay_forward" if args.use_rollout_routing_replay else "record"
            self.compute_log_prob(data_iterator, num_microbatches)
            if args.use_rollout_routing_replay:
                slime_reference.RoutingReplay.clear_all_forward()
        log_rollout_data(rollout_id, args, rollout_data)  # train_metric_utils.log_rollout_data
        if args.use_routing_replay:
            os.environ[STAGE] = "replay_backward"
        train(rollout_id, self.model, self.optimizer, self.opt_param_scheduler, data_iterator, num_microbatches,
              global_batch_sizes)
        if args.use_routing_replay:
            slime_reference.RoutingReplay.clear_all()


def default_args(**overrides) -> types.SimpleNamespace:
    """The slime (and megatron) arguments these code paths read, at slime's defaults for an R3 run."""
    args = dict(
        use_rollout_routing_replay=True, use_routing_replay=True, custom_megatron_init_path=None,
        custom_megatron_before_train_step_hook_path=None, enable_mtp_training=False, mtp_num_layers=None,
        hf_checkpoint=None, num_experts=16, data_pad_size_multiplier=1, sequence_parallel=False, allgather_cp=False,
        seq_length=64, loss_type="policy_loss", kl_coef=0.0, use_rollout_logprobs=False, get_mismatch_metrics=False,
        use_critic=False, keep_old_actor=False, use_opd=False, advantage_estimator="grpo", moe_router_fusion=False,
        moe_router_load_balancing_type="aux_loss", moe_expert_capacity_factor=None,
    )
    args.update(overrides)
    return types.SimpleNamespace(**args)


def install_actor() -> Callable[[], None]:
    """Answer to slime's module names (besides ``slime_reference.install``'s) and apply the gpt_model hunk;
    returns the undo. Call after ``slime_reference.install()``."""
    this = sys.modules[__name__]
    saved = {n: sys.modules.get(n) for n in MODULE_NAMES}
    cls = MegatronTrainRayActor
    saved_class_fill = cls.fill_routing_replay
    saved_step = this.train_one_step
    for name in MODULE_NAMES:
        sys.modules[name] = this
    undo_hunk = _apply_gpt_model_hunk()
    load_function.cache_clear()
    LOGGED.clear()

    def undo() -> None:
        undo_hunk()
        cls.fill_routing_replay = saved_class_fill
        this.MegatronTrainRayActor, this.train_one_step = cls, saved_step
        load_function.cache_clear()
        for n, m in saved.items():
            if m is None:
                sys.modules.pop(n, None)
            else:
                sys.modules[n] = m

    return undo
