"""The CPU runtime's gpt-oss attention sinks (sglang_r3/cpu_runtime/families/gpt_oss.py) against transformers' own
``modeling_gpt_oss.eager_attention_forward``: alone (causal and sliding-window masks, grouped kv heads), and inside
SGLang's ``TorchNativeAttnBackend`` per-request loops (paged KV gathered through ``req_to_token``, a cached prefix,
one decode step), with our ``scaled_dot_product_attention`` in that module's namespace as the hook puts it."""

from __future__ import annotations

import functools
import types

import pytest
import torch

from sglang_r3.cpu_runtime.families import gpt_oss
from sglang_r3.seam.swap import swapped


torch.set_num_threads(1)

HEADS, KV_HEADS, DIM = 4, 2, 16


def _transformers(q, k, v, sinks, window=None):
    """transformers' eager attention for gpt-oss over one whole sequence ([1, heads, len, dim]); its mask as
    transformers builds it: causal, and for sliding layers the last ``window`` keys including the query's own."""
    from transformers.models.gpt_oss.modeling_gpt_oss import eager_attention_forward

    n = q.shape[-2]
    qp, kp = torch.arange(n)[:, None], torch.arange(n)[None, :]
    allowed = (kp <= qp) & ((kp > qp - window) if window else True)
    mask = torch.zeros(n, n).masked_fill(~allowed, float("-inf"))
    module = types.SimpleNamespace(num_key_value_groups=HEADS // KV_HEADS, sinks=sinks, training=False)
    out, _ = eager_attention_forward(module, q, k, v, mask, scaling=DIM ** -0.5)
    return out[0]  # [len, heads, dim]


def _qkv(n, seed):
    gen = torch.Generator().manual_seed(seed)
    q = torch.randn(1, HEADS, n, DIM, generator=gen)
    k = torch.randn(1, KV_HEADS, n, DIM, generator=gen)
    v = torch.randn(1, KV_HEADS, n, DIM, generator=gen)
    sinks = torch.randn(HEADS, generator=gen).to(torch.bfloat16)  # as SGLang holds them
    return q, k, v, sinks


@pytest.mark.sglang  # SGLang's own sliding-window mask
@pytest.mark.parametrize("window", [None, 4])
def test_sdpa_with_sinks_is_transformers_eager_attention(window):
    q, k, v, sinks = _qkv(11, seed=1)
    want = _transformers(q, k, v, sinks.float(), window)
    if window is None:
        got = gpt_oss.sdpa_with_sinks(q, k, v, sinks, is_causal=True, scale=DIM ** -0.5, enable_gqa=True)
    else:  # SGLang's window for gpt-oss is sliding_window - 1 (gpt_oss.py get_attention_sliding_window_size)
        from sglang.srt.layers.attention.torch_native_backend import TorchNativeAttnBackend

        mask = TorchNativeAttnBackend._make_sliding_window_mask(q_len=11, kv_len=11, sliding_window_size=window - 1,
                                                                device=q.device)
        got = gpt_oss.sdpa_with_sinks(q, k, v, sinks, attn_mask=mask, scale=DIM ** -0.5, enable_gqa=True)
    torch.testing.assert_close(got[0].movedim(0, 1), want, atol=1e-5, rtol=1e-5)


@pytest.mark.fast
def test_sinks_change_the_output():
    q, k, v, sinks = _qkv(6, seed=2)
    plain = torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True)
    with_sinks = gpt_oss.sdpa_with_sinks(q, k, v, sinks, is_causal=True, enable_gqa=True)
    assert not torch.allclose(plain, with_sinks, atol=1e-3)


@pytest.mark.sglang
@pytest.mark.parametrize("window", [None, 4])
def test_torch_native_extend_and_decode_with_sinks_are_transformers(window):
    """One request of 9 tokens: 3 cached, 5 extended, then 1 decoded, its KV scattered over a 32-slot pool."""
    from sglang.srt.layers.attention import torch_native_backend as tnb

    n, prefix, extend = 9, 3, 5
    q, k, v, sinks = _qkv(n, seed=3 if window is None else 4)
    want = _transformers(q, k, v, sinks.float(), window)
    slots = torch.randperm(32, generator=torch.Generator().manual_seed(5))[:n]
    k_cache, v_cache = torch.zeros(32, KV_HEADS, DIM), torch.zeros(32, KV_HEADS, DIM)
    k_cache[slots], v_cache[slots] = k[0].movedim(0, 1), v[0].movedim(0, 1)
    req_to_token = torch.zeros(2, 16, dtype=torch.int64)
    req_to_token[1, :n] = slots
    backend = object.__new__(tnb.TorchNativeAttnBackend)
    sdpa = functools.partial(gpt_oss._sdpa_around, tnb.scaled_dot_product_attention)  # torch's, as the hook wraps it
    common = dict(req_to_token=req_to_token, req_pool_indices=torch.tensor([1]), scaling=DIM ** -0.5,
                  enable_gqa=True, sliding_window_size=None if window is None else window - 1)
    token = gpt_oss._SINKS.set(sinks)
    try:
        with swapped(tnb, "scaled_dot_product_attention", sdpa):
            rows = q[0].movedim(0, 1)  # [len, heads, dim]
            out = torch.zeros(extend, HEADS, DIM)
            backend._run_sdpa_forward_extend(
                rows[prefix:prefix + extend], out, k_cache, v_cache, seq_lens=torch.tensor([prefix + extend]),
                extend_prefix_lens=torch.tensor([prefix]), extend_seq_lens=torch.tensor([extend]), causal=True,
                **common)
            step = torch.zeros(1, HEADS, DIM)
            backend._run_sdpa_forward_decode(rows[prefix + extend:n], step, k_cache, v_cache,
                                             seq_lens=torch.tensor([n]), **common)
    finally:
        gpt_oss._SINKS.reset(token)
    torch.testing.assert_close(out, want[prefix:prefix + extend], atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(step, want[n - 1:n], atol=1e-5, rtol=1e-5)
