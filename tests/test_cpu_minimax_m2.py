"""The CPU runtime's MiniMax-M2 QK norm (sglang_r3/cpu_runtime/families/minimax_m2.py) against transformers' own
``MiniMaxM2RMSNorm`` over the whole q / k width, with the width split into TP shards as SGLang's
``MiniMaxM2QKRMSNorm._forward_naive`` splits it: each shard's sums, added as the attention-TP all-reduce adds them,
then applied to each shard with its slice of the weight."""

from __future__ import annotations

import pytest
import torch

from sglang_r3.cpu_runtime.families import minimax_m2

pytestmark = pytest.mark.fast

torch.set_num_threads(1)


@pytest.mark.parametrize("tp", [1, 2, 4])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_qk_norm_is_transformers_rms_norm_over_the_whole_width(tp, dtype):
    from transformers.models.minimax_m2.modeling_minimax_m2 import MiniMaxM2RMSNorm

    gen = torch.Generator().manual_seed(tp)
    tokens, q_width, k_width, eps = 5, 64, 32, 1e-6
    q = torch.randn(tokens, q_width, generator=gen).to(dtype)
    k = (3 * torch.randn(tokens, k_width, generator=gen)).to(dtype)
    q_norm, k_norm = MiniMaxM2RMSNorm(q_width, eps).to(dtype), MiniMaxM2RMSNorm(k_width, eps).to(dtype)  # as served
    with torch.no_grad():
        q_norm.weight.copy_(torch.randn(q_width, generator=gen))
        k_norm.weight.copy_(torch.randn(k_width, generator=gen))
        want_q, want_k = q_norm(q), k_norm(k)
    qs, ks = q.chunk(tp, dim=-1), k.chunk(tp, dim=-1)
    sums = sum(minimax_m2.rms_sumsq(a.contiguous(), b.contiguous()) for a, b in zip(qs, ks))  # the all-reduce
    assert sums.shape[0] % 4 == 0  # padded as SGLang pads it for its custom all-reduce
    got = [minimax_m2.rms_apply(a, b, wq, wk, sums, tp, eps)
           for a, b, wq, wk in zip(qs, ks, q_norm.weight.detach().chunk(tp), k_norm.weight.detach().chunk(tp))]
    got_q, got_k = torch.cat([g[0] for g in got], -1), torch.cat([g[1] for g in got], -1)
    assert got_q.dtype == dtype and got_k.dtype == dtype
    tol = dict(atol=1e-5, rtol=1e-5) if dtype == torch.float32 else dict(atol=2e-2, rtol=2e-2)
    torch.testing.assert_close(got_q, want_q, **tol)
    torch.testing.assert_close(got_k, want_k, **tol)
