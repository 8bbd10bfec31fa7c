"""Test-only: build a real megatron-core MoE+MTP GPTModel on CPU in one gloo process.

Megatron-core assumes CUDA in a few places; these shims make it run on CPU
without mocking any of the code under test (routers, RouterReplay, MTP).
"""

from __future__ import annotations

import os
import socket
import sys
import types
from dataclasses import dataclass
from typing import List, Optional

import torch

_INITIALIZED = False


class _CpuTorch(types.ModuleType):
    """torch, except that tensors asked for on "cuda" are made on the CPU."""

    def __getattr__(self, name):
        return getattr(torch, name)

    @staticmethod
    def zeros(*args, device=None, **kwargs):
        return torch.zeros(*args, device="cpu" if str(device).startswith("cuda") else device, **kwargs)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def init_megatron_cpu(
    rank: int = 0, world_size: int = 1, pipeline_parallel: int = 1, virtual_pipeline: Optional[int] = None
) -> None:
    """gloo ranks (one by default), CPU shims; model-parallel sizes 1 except pipeline. Idempotent.

    Several ranks: each process calls this with its rank; MASTER_ADDR/MASTER_PORT must be set."""
    global _INITIALIZED
    if _INITIALIZED:
        return
    torch.set_num_threads(1)
    # flash_mla's CUDA .so raises OSError (not ImportError) without libcuda;
    # a None entry makes megatron's guarded import fall back cleanly.
    sys.modules.setdefault("flash_mla", None)
    # Megatron allocates buffers on torch.cuda.current_device(); on CPU that must be "cpu".
    torch.cuda.current_device = lambda: "cpu"
    from megatron.core.transformer.moe import moe_utils

    # The TE fused gemm path is probed by attribute; None selects the torch path.
    moe_utils.te_general_gemm = None
    # The schedules count tokens in a tensor made on device="cuda"; give them a torch that makes it on CPU.
    from megatron.core.pipeline_parallel import schedules

    schedules.torch = _CpuTorch("torch")
    # Activation recompute saves and restores the CUDA generator around the recomputed forward;
    # on CPU there is only the CPU generator, which megatron saves and restores itself.
    from megatron.core.tensor_parallel import random as mrandom

    mrandom._get_cuda_rng_state = lambda *a, **k: torch.get_rng_state()
    mrandom._set_cuda_rng_state = lambda *a, **k: None

    if pipeline_parallel > 1:
        # Stages tie the embedding across first and last stage by moving it .cuda() for an
        # all-reduce, and sync the device after p2p sends; on CPU both stay on the host.
        torch.Tensor.cuda = lambda self, *a, **k: self
        torch.cuda.synchronize = lambda *a, **k: None

    import torch.distributed as dist
    from megatron.core import parallel_state
    from megatron.core.tensor_parallel.random import model_parallel_cuda_manual_seed

    if not dist.is_initialized():
        os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
        os.environ.setdefault("MASTER_PORT", str(_free_port()))
        dist.init_process_group("gloo", rank=rank, world_size=world_size)
    parallel_state.initialize_model_parallel(
        1, pipeline_parallel, virtual_pipeline_model_parallel_size=virtual_pipeline
    )
    model_parallel_cuda_manual_seed(1234, inference_rng_tracker=True, force_reset_rng=True)
    _INITIALIZED = True


@dataclass
class TinyMoeSpec:
    """Shaped like the embedded GLM-4.7-style model: first layer dense, the rest MoE."""

    num_layers: int = 4
    dense_first: int = 1
    num_experts: int = 16
    topk: int = 4
    hidden: int = 64
    heads: int = 4
    ffn: int = 128
    moe_ffn: int = 32
    vocab: int = 128
    max_seq: int = 256
    mtp_layers: int = 1
    routing_replay: bool = True
    moe_layer_freq: Optional[List[int]] = None

    def layer_pattern(self) -> List[int]:
        if self.moe_layer_freq is not None:
            return list(self.moe_layer_freq)
        return [0] * self.dense_first + [1] * (self.num_layers - self.dense_first)


def build_gpt(spec: TinyMoeSpec, seed: int = 1234, vp_stage: Optional[int] = None, **config_overrides):
    """config_overrides: extra TransformerConfig fields (e.g. activation recompute).
    vp_stage: the virtual pipeline stage this chunk is (with virtual_pipeline_model_parallel_size set)."""
    init_megatron_cpu()
    from megatron.core.models.gpt import GPTModel
    from megatron.core.models.gpt.gpt_layer_specs import (
        get_gpt_decoder_block_spec,
        get_gpt_mtp_block_spec,
    )
    from megatron.core.tensor_parallel.random import model_parallel_cuda_manual_seed
    from megatron.core.transformer import TransformerConfig

    torch.manual_seed(seed)
    model_parallel_cuda_manual_seed(seed, inference_rng_tracker=True, force_reset_rng=True)
    config = TransformerConfig(
        num_layers=spec.num_layers,
        hidden_size=spec.hidden,
        num_attention_heads=spec.heads,
        ffn_hidden_size=spec.ffn,
        moe_ffn_hidden_size=spec.moe_ffn,
        num_moe_experts=spec.num_experts,
        moe_router_topk=spec.topk,
        moe_layer_freq=spec.layer_pattern(),
        moe_token_dispatcher_type="allgather",
        moe_router_load_balancing_type="aux_loss",
        moe_aux_loss_coeff=1e-3,
        moe_enable_routing_replay=spec.routing_replay,
        mtp_num_layers=spec.mtp_layers or None,
        mtp_loss_scaling_factor=0.1,
        use_cpu_initialization=True,
        bf16=False,
        params_dtype=torch.float32,
        hidden_dropout=0.0,
        attention_dropout=0.0,
        add_bias_linear=False,
        gated_linear_unit=True,
        **config_overrides,
    )
    from megatron.core import parallel_state as ps

    # A pipeline stage builds its own slice of layers; the MTP block sits on the last stage.
    virtual = vp_stage is not None
    first = ps.is_pipeline_first_stage(ignore_virtual=not virtual, vp_stage=vp_stage)
    last = ps.is_pipeline_last_stage(ignore_virtual=not virtual, vp_stage=vp_stage)
    pp_rank = ps.get_pipeline_model_parallel_rank()
    block = get_gpt_decoder_block_spec(
        config, use_transformer_engine=False, normalization="RMSNorm", vp_stage=vp_stage, pp_rank=pp_rank
    )
    mtp = (
        get_gpt_mtp_block_spec(config, block, use_transformer_engine=False, vp_stage=vp_stage, pp_rank=pp_rank)
        if spec.mtp_layers
        else None
    )
    model = GPTModel(
        config=config,
        transformer_layer_spec=block,
        vocab_size=spec.vocab,
        max_sequence_length=spec.max_seq,
        position_embedding_type="rope",
        mtp_block_spec=mtp,
        pre_process=first,
        post_process=last,
        **({"vp_stage": vp_stage} if virtual else {}),
    )
    return model


_CONVERTED = {}


def converted_embedded_model(**config_overrides):
    """The embedded SGLang checkpoint loaded into a Megatron GPTModel (fp32), built once per overrides."""
    key = tuple(sorted(config_overrides.items()))
    if key not in _CONVERTED:
        init_megatron_cpu()
        from sglang_r3.dev.embedded import ensure_embedded_model
        from tests.trainer.convert import load_glm_megatron

        _CONVERTED[key] = load_glm_megatron(ensure_embedded_model(), **config_overrides)[0]
    return _CONVERTED[key]


def causal_mask(seq_len: int) -> torch.Tensor:
    """[1, 1, S, S] bool, True = masked. Passed explicitly because megatron's default mask is built on 'cuda'."""
    return torch.triu(torch.ones(seq_len, seq_len, dtype=torch.bool), diagonal=1)[None, None]


def routers(model):
    """(path, TopKRouter) pairs in module order."""
    from megatron.core.transformer.moe.router import TopKRouter

    return [(n, m) for n, m in model.named_modules() if isinstance(m, TopKRouter)]


class RouterSpy:
    """Forward hooks that keep what each router saw and chose (input, routing_map)."""

    def __init__(self, model):
        self.seen = {}
        self._handles = [m.register_forward_hook(self._hook(n)) for n, m in routers(model)]

    def _hook(self, name):
        def hook(module, args, output):
            _, routing_map = output
            self.seen.setdefault(name, []).append((args[0].detach(), routing_map.detach()))

        return hook

    def chosen(self, name, call=0):
        """[tokens, topk] sorted expert ids the router chose in its `call`-th forward."""
        routing_map = self.seen[name][call][1]
        k = int(routing_map.sum(dim=1)[0])
        return torch.sort(torch.nonzero(routing_map)[:, 1].reshape(-1, k), dim=1).values

    def close(self):
        for h in self._handles:
            h.remove()


def forward_loss(model, token_ids: torch.Tensor, train: bool = True) -> torch.Tensor:
    """One packed microbatch [1, S] through the model with next-token labels; returns per-token loss."""
    model.train(train)
    S = token_ids.shape[-1]
    ids = token_ids.reshape(1, S)
    labels = torch.roll(ids, -1, dims=1)
    pos = torch.arange(S).reshape(1, S)
    return model(ids, pos, causal_mask(S), labels=labels)
