"""Expert parallelism on the CPU runtime: SGLang's CPU experts with another rank's experts (id ``-1``) adding zero.

``sglang_r3/cpu_runtime/platform/expert_parallel.py`` lets SGLang's ``moe_forward_native`` run the local ids
``StandardDispatcher`` hands it under ``--ep-size N`` (a ``-1`` for every expert another rank holds). The oracle
is SGLang's own ``moe_forward_native`` on one rank holding every expert: summed over the N ranks (what the
group's all-reduce does), each rank's output must equal it, whatever the ids, the number of ranks, and DP
padding rows (every slot ``-1``). The served check is ``tests/test_dp_attention.py``'s EP class; DeepEP, which
the CPU runtime cannot run, is checked at the bottom.
"""

from __future__ import annotations

import functools
from types import SimpleNamespace

import pytest
import torch

pytestmark = [pytest.mark.sglang, pytest.mark.release]

EXPERTS, HIDDEN, INTER, TOPK = 16, 24, 8, 4


def _experts(seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    w13 = torch.randn(EXPERTS, 2 * INTER, HIDDEN, generator=g) / HIDDEN ** 0.5
    w2 = torch.randn(EXPERTS, HIDDEN, INTER, generator=g) / INTER ** 0.5
    return w13, w2


def _routing(tokens: int, seed: int = 1):
    g = torch.Generator().manual_seed(seed)
    ids = torch.stack([torch.randperm(EXPERTS, generator=g)[:TOPK] for _ in range(tokens)]).to(torch.int32)
    weights = torch.softmax(torch.randn(tokens, TOPK, generator=g), dim=-1)
    return ids, weights


def _local_ids(ids: torch.Tensor, rank: int, ep: int) -> torch.Tensor:
    """The ids StandardDispatcher.dispatch hands rank ``rank``: local for its experts, -1 for the others'."""
    per = EXPERTS // ep
    mapping = torch.full((EXPERTS,), -1, dtype=torch.int32)
    mapping[rank * per:(rank + 1) * per] = torch.arange(per, dtype=torch.int32)
    return mapping[ids.long()]


@pytest.fixture(autouse=True)
def _server_args_published():
    """SGLang 0.5.15's ``SiluAndMul`` reads the process's ServerArgs when it is built (a scheduler publishes
    them); here a default record, as SGLang's own test kits publish one, and the slot as it was afterwards."""
    from sglang.srt.runtime_context import get_context

    ctx = get_context()
    saved = ctx._server_args
    if saved is None:
        from sglang.srt.server_args import ServerArgs

        ctx.set_server_args(ServerArgs(model_path="dummy", device="cpu"))
    yield
    ctx._server_args = saved


def _sglang():
    from sglang.srt.layers.moe.fused_moe_native import moe_forward_native
    from sglang.srt.layers.moe.moe_runner import MoeRunnerConfig
    from sglang.srt.layers.moe.topk import StandardTopKOutput

    return moe_forward_native, MoeRunnerConfig, StandardTopKOutput


def _layer(w13, w2, experts: slice):
    # What moe_forward_native reads of a FusedMoE: the global expert count and this rank's weights.
    return SimpleNamespace(num_experts=EXPERTS, w13_weight=w13[experts], w2_weight=w2[experts])


@pytest.mark.parametrize("ep", [2, 4])
@pytest.mark.parametrize("tokens", [1, 7, 40])
def test_the_ranks_outputs_sum_to_sglangs_one_rank_output(ep, tokens):
    from sglang_r3.cpu_runtime.platform.expert_parallel import experts_with_dropped_slots

    moe_forward_native, MoeRunnerConfig, StandardTopKOutput = _sglang()
    w13, w2 = _experts()
    ids, weights = _routing(tokens)
    x = torch.randn(tokens, HIDDEN, generator=torch.Generator().manual_seed(2))
    config = MoeRunnerConfig(activation="silu")
    want = moe_forward_native(_layer(w13, w2, slice(None)), x, StandardTopKOutput(weights, ids, None), config)

    per = EXPERTS // ep
    parts = []
    for rank in range(ep):
        local = StandardTopKOutput(weights, _local_ids(ids, rank, ep), None)
        layer = _layer(w13, w2, slice(rank * per, (rank + 1) * per))
        with pytest.raises((IndexError, RuntimeError)):  # SGLang's own function stops on the -1 ids
            moe_forward_native(layer, x, local, config)
        parts.append(experts_with_dropped_slots(moe_forward_native, layer, x, local, config))
    torch.testing.assert_close(sum(parts), want, rtol=1e-5, atol=1e-6)


def test_a_token_none_of_the_ranks_experts_serve_and_padding_rows_are_zero():
    from sglang_r3.cpu_runtime.platform.expert_parallel import experts_with_dropped_slots

    moe_forward_native, MoeRunnerConfig, StandardTopKOutput = _sglang()
    w13, w2 = _experts()
    ids, weights = _routing(6)
    ids[2] = torch.tensor([8, 9, 10, 11], dtype=torch.int32)  # all on rank 1
    local = _local_ids(ids, 0, 2)
    local[4:] = -1  # DP padding rows (SGLang masks them to -1 under MAX_LEN padding)
    x = torch.randn(6, HIDDEN)
    x[5] = float("nan")  # a padding row's stale hidden state must not matter
    out = experts_with_dropped_slots(moe_forward_native, _layer(w13, w2, slice(0, 8)), x,
                                     StandardTopKOutput(weights, local, None), MoeRunnerConfig(activation="silu"))
    assert torch.count_nonzero(out[[2, 4, 5]]) == 0
    assert torch.isfinite(out).all() and torch.count_nonzero(out[[0, 1, 3]], dim=-1).all()


def test_without_dropped_slots_sglangs_own_function_runs_untouched():
    from sglang_r3.cpu_runtime.platform.expert_parallel import experts_with_dropped_slots

    moe_forward_native, MoeRunnerConfig, StandardTopKOutput = _sglang()
    w13, w2 = _experts()
    ids, weights = _routing(5)
    calls = []

    @functools.wraps(moe_forward_native)
    def original(*args):
        calls.append(args)
        return moe_forward_native(*args)

    topk = StandardTopKOutput(weights, ids, None)
    layer, x, config = _layer(w13, w2, slice(None)), torch.randn(5, HIDDEN), MoeRunnerConfig(activation="silu")
    out = experts_with_dropped_slots(original, layer, x, topk, config)
    assert len(calls) == 1 and calls[0][2] is topk
    torch.testing.assert_close(out, moe_forward_native(layer, x, topk, config), rtol=0, atol=0)


def test_deepep_stops_in_sglangs_own_dispatcher_on_this_host():
    """Why DeepEP is refused at start-up on the CPU runtime (refusals.startup._DEEPEP_ON_CPU, refusal checked in
    tests/test_startup_refusals.py): SGLang's import of deep_ep fails on a host without a GPU (0.5.23 ships a
    deep_ep that checks for a CUDA device at import; 0.5.15's image has none), and the DeepEP dispatcher SGLang
    builds with the first MoE layer raises ImportError. A GPU host has a working deep_ep: nothing to check."""
    from sglang_r3.dev.cpu import has_gpu

    if has_gpu():
        pytest.skip("a GPU host: DeepEP may run here")
    from sglang.srt.layers.moe.token_dispatcher import deepep

    assert deepep.use_deepep is False
    with pytest.raises(ImportError, match="DeepEP is not"):
        deepep._DeepEPDispatcherImplBase(group=None, router_topk=TOPK, permute_fusion=False, num_experts=EXPERTS,
                                         num_local_experts=EXPERTS // 2, hidden_size=HIDDEN,
                                         params_dtype=torch.float32, deepep_mode=deepep.DeepEPMode.AUTO)


def _compiled_mode_moe_forward():
    """The MoE forward SGLang's torch.compile mode swaps in at a batch of one token, read from SGLang itself."""
    from sglang_r3.seam.versions import installed

    if installed() == "0.5.15.post1":  # MultiPlatformOp.enter_torch_compile imports it by name for FusedMoE
        import inspect

        from sglang.srt.layers.moe.fused_moe_native import fused_moe_forward_native
        from sglang.srt.layers.utils.multi_platform import MultiPlatformOp

        assert "fused_moe_forward_native" in inspect.getsource(MultiPlatformOp.enter_torch_compile)
        return fused_moe_forward_native
    from sglang.srt.layers.quantization.unquant import UnquantizedFusedMoEMethod

    return UnquantizedFusedMoEMethod._torch_compile_forward(None, num_tokens=1)


def test_sglangs_compiled_mode_moe_forward_adds_the_last_local_expert_for_another_ranks_expert():
    """Why ``--enable-torch-compile`` with ``--ep-size`` is refused off the CPU runtime (refusals.startup,
    refusal checked in tests/test_startup_refusals.py): the compiled mode's MoE forward indexes the weights with
    the ``-1`` ids, so a rank adds its last expert where the CUDA kernel adds zero, and the ranks' outputs no
    longer sum to the one-rank output (the oracle: SGLang's own moe_forward_native holding every expert)."""
    from sglang.srt.layers.moe.token_dispatcher.standard import StandardDispatchOutput

    compiled = _compiled_mode_moe_forward()
    moe_forward_native, MoeRunnerConfig, StandardTopKOutput = _sglang()
    w13, w2 = _experts()
    ids, weights = _routing(1)
    x = torch.randn(1, HIDDEN, generator=torch.Generator().manual_seed(3))
    config = MoeRunnerConfig(activation="silu")
    want = moe_forward_native(_layer(w13, w2, slice(None)), x, StandardTopKOutput(weights, ids, None), config)

    def rank_output(rank, ep=2):
        per = EXPERTS // ep
        layer = _layer(w13, w2, slice(rank * per, (rank + 1) * per))
        layer.moe_runner_config = config
        local = StandardTopKOutput(weights, _local_ids(ids, rank, ep), None)
        return compiled(layer, StandardDispatchOutput(hidden_states=x, hidden_states_scale=None,
                                                      topk_output=local)).hidden_states

    # With every expert on one rank the compiled-mode forward is the model's ...
    whole = _layer(w13, w2, slice(None))
    whole.moe_runner_config = config
    full = compiled(whole, StandardDispatchOutput(hidden_states=x, hidden_states_scale=None,
                                                  topk_output=StandardTopKOutput(weights, ids, None))).hidden_states
    torch.testing.assert_close(full, want, rtol=1e-5, atol=1e-6)
    # ... and split over two ranks it is not: the -1 slots index the last local expert.
    assert (ids < EXPERTS // 2).any() and (ids >= EXPERTS // 2).any()  # the token has experts on both ranks
    assert not torch.allclose(rank_output(0) + rank_output(1), want, rtol=1e-3, atol=1e-4)
