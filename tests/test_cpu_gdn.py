"""The CPU runtime's gated delta-net ops (sglang_r3/cpu_runtime/ops/gdn.py) against transformers 5.19's own torch
code for Qwen3-Next and Qwen3.5 (``modeling_qwen3_next``: ``torch_chunk_gated_delta_rule``,
``torch_recurrent_gated_delta_rule``, ``causal_conv1d_fn`` / ``causal_conv1d_update``, ``Qwen3NextRMSNormGated``,
``Qwen3NextGatedDeltaNet``; ``modeling_qwen3_5_moe``: ``Qwen3_5MoeRMSNorm``, ``Qwen3_5MoeGatedDeltaNet``).

Shapes as SGLang hands them over: tokens of several sequences back to back (``cu_seqlens``), recurrent states in a
pool of slots laid out ``[heads_v, v_dim, k_dim]`` (the transpose of transformers' ``[.., k_dim, v_dim]``), key and
value head dims that differ, more value heads than key heads, sequences that cross the 64-token chunk boundary.
"""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from sglang_r3.cpu_runtime.ops import gdn

pytestmark = pytest.mark.fast

torch.set_num_threads(1)
ATOL = 2e-5


def _modeling():
    from transformers.models.qwen3_next import modeling_qwen3_next

    return modeling_qwen3_next


def _gates_as_transformers(A_log, a, b, dt_bias):
    # Qwen3NextGatedDeltaNet.forward:
    #   beta = b.sigmoid(); g = -self.A_log.float().exp() * F.softplus(a.float() + self.dt_bias)
    return -A_log.float().exp() * F.softplus(a.float() + dt_bias), b.sigmoid()


def _inputs(lengths, H=2, HV=4, K=16, V=8, seed=0):
    gen = torch.Generator().manual_seed(seed)
    T = sum(lengths)
    q = torch.randn(1, T, H, K, generator=gen)
    k = torch.randn(1, T, H, K, generator=gen)
    v = torch.randn(1, T, HV, V, generator=gen)
    a = torch.randn(T, HV, generator=gen)
    b = torch.randn(T, HV, generator=gen)
    A_log = torch.rand(HV, generator=gen) * 2 - 1
    dt_bias = torch.randn(HV, generator=gen) * 0.5
    cu = torch.tensor([0] + list(torch.tensor(lengths).cumsum(0)), dtype=torch.int32)
    return q, k, v, a, b, A_log, dt_bias, cu


def _pool(slots, HV=4, K=16, V=8, seed=1):
    return torch.randn(slots, HV, V, K, generator=torch.Generator().manual_seed(seed)) * 0.3


def test_chunked_prefill_rule_is_transformers_per_sequence_from_and_into_the_state_slots():
    m = _modeling()
    lengths = [70, 5, 64]  # across the chunk boundary, shorter than a chunk, exactly one
    q, k, v, a, b, A_log, dt_bias, cu = _inputs(lengths)
    g, beta = gdn.fused_gdn_gating_cpu(A_log, a, b, dt_bias)
    pool = _pool(6)
    before = pool.clone()
    slots = torch.tensor([4, 1, 2], dtype=torch.int32)
    out, final = gdn.chunk_gated_delta_rule_cpu(q, k, v, g, beta, pool, True, cu, False, True, slots)
    ratio = v.shape[2] // q.shape[2]
    for n, (s, e) in enumerate(zip(cu[:-1].tolist(), cu[1:].tolist())):
        want_o, want_s = m.torch_chunk_gated_delta_rule(
            q[:, s:e].repeat_interleave(ratio, 2), k[:, s:e].repeat_interleave(ratio, 2), v[:, s:e],
            g=g[:, s:e], beta=beta[:, s:e], initial_state=before[slots[n]].transpose(-1, -2)[None],
            output_final_state=True, use_qk_l2norm_in_kernel=True)
        torch.testing.assert_close(out[:, s:e], want_o, atol=ATOL, rtol=1e-4)
        torch.testing.assert_close(pool[slots[n]], want_s[0].transpose(-1, -2), atol=ATOL, rtol=1e-4)
        torch.testing.assert_close(final[n], want_s[0].transpose(-1, -2), atol=ATOL, rtol=1e-4)
    torch.testing.assert_close(pool[[0, 3, 5]], before[[0, 3, 5]], atol=0, rtol=0)  # other slots untouched


def test_gating_is_transformers():
    _, _, _, a, b, A_log, dt_bias, _ = _inputs([9])
    a = a * 15  # softplus on both sides of its threshold (20)
    g, beta = gdn.fused_gdn_gating_cpu(A_log, a, b, dt_bias)
    want_g, want_beta = _gates_as_transformers(A_log, a, b, dt_bias)
    torch.testing.assert_close(g[0], want_g, atol=1e-6, rtol=1e-6)
    torch.testing.assert_close(beta[0], want_beta, atol=1e-6, rtol=1e-6)
    assert g.shape == (1, 9, 4) and g.dtype == torch.float32


def test_decode_rule_is_transformers_recurrent_rule_token_by_token():
    m = _modeling()
    steps, batch = 3, 2
    pool = _pool(4)
    slots = torch.tensor([3, 0], dtype=torch.int32)
    states = {n: pool[slots[n]].transpose(-1, -2)[None].clone() for n in range(batch)}
    for step in range(steps):
        q, k, v, a, b, A_log, dt_bias, cu = _inputs([1] * batch, seed=10 + step)
        out = gdn.fused_sigmoid_gating_delta_rule_update_cpu(
            A_log=A_log, dt_bias=dt_bias, q=q, k=k, v=v, a=a, b=b, initial_state_source=pool,
            initial_state_indices=slots, cu_seqlens=cu, use_qk_l2norm_in_kernel=True)
        assert out.shape == (1, batch, 4, 8)
        g, beta = _gates_as_transformers(A_log, a, b, dt_bias)
        for n in range(batch):
            want_o, states[n] = m.torch_recurrent_gated_delta_rule(
                q[:, n:n + 1].repeat_interleave(2, 2), k[:, n:n + 1].repeat_interleave(2, 2), v[:, n:n + 1],
                g=g[None, n:n + 1], beta=beta[None, n:n + 1], initial_state=states[n], output_final_state=True,
                use_qk_l2norm_in_kernel=True)
            torch.testing.assert_close(out[:, n:n + 1], want_o, atol=ATOL, rtol=1e-4)
            torch.testing.assert_close(pool[slots[n]], states[n][0].transpose(-1, -2), atol=ATOL, rtol=1e-4)


def test_verify_keeps_every_steps_state_and_leaves_the_slot():
    # A speculative verify (intermediate_states_buffer): step i's state at [row, i], the slot as it was; a drafted
    # tree's token continues from its parent's state.
    m = _modeling()
    q, k, v, a, b, A_log, dt_bias, cu = _inputs([4])
    pool = _pool(2)
    before = pool.clone()
    buf = torch.zeros(3, 4, 4, 8, 16)
    parents = torch.tensor([[-1, 0, 0, 2]])  # token 2 branches from token 0, token 3 follows 2
    out = gdn.fused_sigmoid_gating_delta_rule_update_cpu(
        A_log=A_log, dt_bias=dt_bias, q=q, k=k, v=v, a=a, b=b, initial_state_source=pool,
        initial_state_indices=torch.tensor([1]), cu_seqlens=cu, use_qk_l2norm_in_kernel=True,
        disable_state_update=True, intermediate_states_buffer=buf, intermediate_state_indices=torch.tensor([2]),
        cache_steps=4, retrieve_parent_token=parents)
    torch.testing.assert_close(pool, before, atol=0, rtol=0)
    g, beta = _gates_as_transformers(A_log, a, b, dt_bias)
    states = []
    for i, p in enumerate(parents[0].tolist()):
        start = states[p] if p >= 0 else before[1].transpose(-1, -2)[None]
        want_o, s = m.torch_recurrent_gated_delta_rule(
            q[:, i:i + 1].repeat_interleave(2, 2), k[:, i:i + 1].repeat_interleave(2, 2), v[:, i:i + 1],
            g=g[None, i:i + 1], beta=beta[None, i:i + 1], initial_state=start, output_final_state=True,
            use_qk_l2norm_in_kernel=True)
        states.append(s)
        torch.testing.assert_close(out[:, i:i + 1], want_o, atol=ATOL, rtol=1e-4)
        torch.testing.assert_close(buf[2, i], s[0].transpose(-1, -2), atol=ATOL, rtol=1e-4)


def test_prefill_convolution_is_transformers_with_and_without_the_cached_window():
    m = _modeling()
    dim, width, lengths = 12, 4, [7, 2, 5]
    gen = torch.Generator().manual_seed(3)
    x = torch.randn(sum(lengths), dim, generator=gen)
    weight = torch.randn(dim, width, generator=gen)
    bias = torch.randn(dim, generator=gen)
    states = torch.randn(5, dim, width - 1, generator=gen)
    before = states.clone()
    slots = torch.tensor([2, 0, 4], dtype=torch.int32)
    initial = torch.tensor([False, True, True])
    cu = torch.tensor([0, 7, 9, 14], dtype=torch.int32)
    out = gdn.causal_conv1d_fwd_cpu(x.transpose(0, 1), weight, bias, states, cu, slots, initial, True, -1, True)
    for n, (s, e) in enumerate(zip(cu[:-1].tolist(), cu[1:].tolist())):
        seq = x[s:e].transpose(0, 1)[None]
        if initial[n]:  # transformers' decode-time conv over the cached window, several tokens at once
            window = before[slots[n]][None].clone()
            want = m.causal_conv1d_update(seq, window, weight, bias, activation="silu")
            torch.testing.assert_close(states[slots[n]], window[0])
        else:
            want = m.causal_conv1d_fn(seq, weight, bias, activation="silu")
            padded = torch.cat([torch.zeros(dim, width - 1), seq[0]], -1)
            torch.testing.assert_close(states[slots[n]], padded[:, -(width - 1):])
        torch.testing.assert_close(out[:, s:e], want[0], atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(states[[1, 3]], before[[1, 3]], atol=0, rtol=0)


def test_decode_convolution_is_transformers_causal_conv1d_update():
    m = _modeling()
    dim, width = 12, 4
    gen = torch.Generator().manual_seed(4)
    weight = torch.randn(dim, width, generator=gen)
    states = torch.randn(3, dim, width - 1, generator=gen)
    slots = torch.tensor([2, 0], dtype=torch.int32)
    windows = states[slots.long()].clone()
    for _ in range(3):
        x = torch.randn(2, dim, generator=gen)
        out = gdn.causal_conv1d_update_cpu(x, states, weight, None, True, None, slots, -1, True)
        want = m.causal_conv1d_update(x[..., None], windows, weight, None, activation="silu")
        torch.testing.assert_close(out, want[..., 0], atol=1e-5, rtol=1e-5)
        torch.testing.assert_close(states[slots.long()], windows)


def test_verify_convolution_is_transformers_token_by_token_and_keeps_each_steps_window():
    # A target verify of 4 drafted tokens for two requests (gdn_backend's TARGET_VERIFY branch): each step's output is
    # transformers' causal_conv1d_update run token by token from the slot's window, the window after step i sits at
    # [row, i], and the slot has advanced over every draft (as SGLang's Triton kernel leaves it).
    m = _modeling()
    dim, width, draft = 12, 4, 4
    gen = torch.Generator().manual_seed(5)
    weight, bias = torch.randn(dim, width, generator=gen), torch.randn(dim, generator=gen)
    states = torch.randn(5, dim, width - 1, generator=gen)
    before = states.clone()
    slots, rows = torch.tensor([3, 1], dtype=torch.int32), torch.tensor([0, 1], dtype=torch.int32)
    windows = torch.zeros(3, draft, dim, width - 1)  # SGLang's dense layout on CPU: [rows + 1, draft, dim, K - 1]
    x = torch.randn(2, dim, draft, generator=gen)
    out = gdn.causal_conv1d_verify_update(x, states, weight, bias, True, slots, windows, rows)
    for b, slot in enumerate(slots.tolist()):
        window = before[slot][None].clone()
        for i in range(draft):
            want = m.causal_conv1d_update(x[b:b + 1, :, i:i + 1], window, weight, bias, activation="silu")
            torch.testing.assert_close(out[b, :, i], want[0, :, 0], atol=1e-5, rtol=1e-5)
            torch.testing.assert_close(windows[rows[b], i], window[0])
        torch.testing.assert_close(states[slot], window[0])
    torch.testing.assert_close(states[[0, 2, 4]], before[[0, 2, 4]], atol=0, rtol=0)


def test_the_commit_after_a_verify_takes_each_requests_last_accepted_step():
    # update_mamba_state_after_mtp_verify's scatter: per request, the recurrent state and conv window of its last
    # accepted step into its slot (a step of -1: untouched), and into its track slot where tracked; the verify's
    # rows are the requests' batch positions, or the given ones (SGLang's src_indices_raw).
    from types import SimpleNamespace

    gen = torch.Generator().manual_seed(6)
    caches = SimpleNamespace(temporal=torch.randn(2, 6, 4, 8, 16, generator=gen),
                             intermediate_ssm=torch.randn(2, 4, 4, 4, 8, 16, generator=gen),
                             conv=[torch.randn(2, 6, 12, 3, generator=gen)],
                             intermediate_conv_window=[torch.randn(2, 4, 4, 12, 3, generator=gen)])
    before = SimpleNamespace(temporal=caches.temporal.clone(), conv=caches.conv[0].clone())
    slots, steps = torch.tensor([5, 2, 0], dtype=torch.int32), torch.tensor([2, 0, -1], dtype=torch.int32)
    track, track_steps = torch.tensor([4, 1, 3], dtype=torch.int32), torch.tensor([1, -1, -1], dtype=torch.int32)
    gdn.scatter_mamba_states_after_mtp_verify_cpu(caches, slots, steps, track, track_steps)
    for dst, src, old in ((caches.temporal, caches.intermediate_ssm, before.temporal),
                          (caches.conv[0], caches.intermediate_conv_window[0], before.conv)):
        torch.testing.assert_close(dst[:, 5], src[:, 0, 2], atol=0, rtol=0)
        torch.testing.assert_close(dst[:, 2], src[:, 1, 0], atol=0, rtol=0)
        torch.testing.assert_close(dst[:, 4], src[:, 0, 1], atol=0, rtol=0)
        torch.testing.assert_close(dst[:, [0, 1, 3]], old[:, [0, 1, 3]], atol=0, rtol=0)
    gdn.scatter_mamba_states_after_mtp_verify_cpu(caches, slots[:1], steps[:1], None, None,
                                                  src_indices_raw=torch.tensor([3], dtype=torch.int32))
    torch.testing.assert_close(caches.temporal[:, 5], caches.intermediate_ssm[:, 3, 2], atol=0, rtol=0)
    torch.testing.assert_close(caches.conv[0][:, 5], caches.intermediate_conv_window[0][:, 3, 2], atol=0, rtol=0)


def test_gated_rmsnorm_is_transformers():
    m = _modeling()
    norm = m.Qwen3NextRMSNormGated(8, eps=1e-6)
    with torch.no_grad():
        norm.weight.normal_()
    x, z = torch.randn(10, 8), torch.randn(10, 8)
    torch.testing.assert_close(gdn._gated_rms(x, z, norm.weight, 1e-6, "silu"), norm(x, z), atol=1e-6, rtol=1e-5)


def test_one_linear_attention_layer_is_transformers_qwen3_next_gated_delta_net():
    # transformers' whole Qwen3NextGatedDeltaNet over two sequences, against the ops in SGLang's order: convolution,
    # gating, chunked rule (from zeroed slots), gated norm.
    import transformers

    m = _modeling()
    cfg = transformers.Qwen3NextConfig(hidden_size=64, linear_num_key_heads=2, linear_num_value_heads=4,
                                       linear_key_head_dim=16, linear_value_head_dim=8, linear_conv_kernel_dim=4,
                                       num_hidden_layers=1, layer_types=["linear_attention"])
    torch.manual_seed(5)
    layer = m.Qwen3NextGatedDeltaNet(cfg, 0).eval()
    with torch.no_grad():
        layer.norm.weight.normal_()
    lengths = [9, 67]
    xs = [torch.randn(1, n, 64) for n in lengths]
    with torch.no_grad():
        want = torch.cat([layer(x) for x in xs], 1)
        x = torch.cat(xs, 1)
        q, k, v, z, b, a = layer.fix_query_key_value_ordering(layer.in_proj_qkvz(x), layer.in_proj_ba(x))
        mixed = torch.cat([t.reshape(t.shape[1], -1) for t in (q, k, v)], -1)
        cu = torch.tensor([0, lengths[0], sum(lengths)], dtype=torch.int32)
        conv_states = torch.zeros(2, mixed.shape[1], 3)
        slots = torch.tensor([0, 1], dtype=torch.int32)
        mixed = gdn.causal_conv1d_fwd_cpu(mixed.transpose(0, 1), layer.conv1d.weight.squeeze(1), None, conv_states,
                                          cu, slots, torch.tensor([False, False]), True, -1, True).transpose(0, 1)
        q, k, v = torch.split(mixed, [layer.key_dim, layer.key_dim, layer.value_dim], -1)
        g, beta = gdn.fused_gdn_gating_cpu(layer.A_log, a[0], b[0], layer.dt_bias)
        pool = torch.zeros(2, 4, 8, 16)
        out, _ = gdn.chunk_gated_delta_rule_cpu(q.reshape(1, -1, 2, 16), k.reshape(1, -1, 2, 16),
                                                v.reshape(1, -1, 4, 8), g, beta, pool, True, cu, False, True, slots)
        out = gdn._gated_rms(out.reshape(-1, 8), z.reshape(-1, 8), layer.norm.weight, layer.norm.variance_epsilon,
                             "silu")
        got = layer.out_proj(out.reshape(1, -1, 32))
    torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-4)


def test_qwen3_5_qk_gemma_norm_gate_split_and_output_gate_are_transformers():
    from transformers.models.qwen3_5_moe.modeling_qwen3_5_moe import Qwen3_5MoeRMSNorm

    heads, kv_heads, d, T = 4, 2, 16, 5
    qn, kn = Qwen3_5MoeRMSNorm(d, eps=1e-6), Qwen3_5MoeRMSNorm(d, eps=1e-6)
    with torch.no_grad():
        qn.weight.normal_()
        kn.weight.normal_()
    q_gate = torch.randn(T, heads * 2 * d)
    k = torch.randn(T, kv_heads * d)
    q, gate = q_gate.view(T, heads, 2 * d).chunk(2, -1)  # Qwen3_5MoeAttention: per head [q | gate]
    got_q, got_k, got_gate = gdn.fused_qk_gemma_rmsnorm_with_gate_cpu(q_gate, k, qn.weight, kn.weight, 1e-6, d, heads)
    torch.testing.assert_close(got_q, qn(q).reshape(-1, d), atol=1e-6, rtol=1e-5)
    torch.testing.assert_close(got_k, kn(k.view(T, kv_heads, d)).reshape(-1, d), atol=1e-6, rtol=1e-5)
    torch.testing.assert_close(got_gate, gate.reshape(-1, d))
    got_q2, got_k2 = gdn.fused_qk_gemma_rmsnorm_cpu(q.reshape(T, -1), k, qn.weight, kn.weight, 1e-6, d)
    torch.testing.assert_close(got_q2, got_q)
    attn = torch.randn(T, heads * d)
    want = attn * torch.sigmoid(gate.reshape(T, -1))  # Qwen3_5MoeAttention: attn_output * torch.sigmoid(gate)
    gdn.fused_sigmoid_mul_cpu(attn, gate)
    torch.testing.assert_close(attn, want)


def test_qwen3_5_projection_split_is_transformers_separate_projections():
    import transformers
    from transformers.models.qwen3_5_moe.modeling_qwen3_5_moe import Qwen3_5MoeGatedDeltaNet

    cfg = transformers.Qwen3_5MoeTextConfig(hidden_size=64, linear_num_key_heads=2, linear_num_value_heads=4,
                                            linear_key_head_dim=16, linear_value_head_dim=8, num_hidden_layers=1,
                                            layer_types=["linear_attention"])
    layer = Qwen3_5MoeGatedDeltaNet(cfg, 0)
    x = torch.randn(6, 64)
    with torch.no_grad():  # SGLang merges the projections into [q|k|v|z] and [b|a] (qwen3_5.py's loader)
        qkvz = torch.cat([layer.in_proj_qkv(x), layer.in_proj_z(x)], -1)
        ba = torch.cat([layer.in_proj_b(x), layer.in_proj_a(x)], -1)
        mixed, z, b, a = gdn.fused_qkvzba_split_reshape_cat_contiguous_cpu(qkvz, ba, 2, 4, 16, 8)
        torch.testing.assert_close(mixed, layer.in_proj_qkv(x))
        torch.testing.assert_close(z, layer.in_proj_z(x).reshape(6, 4, 8))
        torch.testing.assert_close(b, layer.in_proj_b(x))
        torch.testing.assert_close(a, layer.in_proj_a(x))


def test_shared_expert_gate_is_transformers_sparse_block_formula():
    gate = torch.nn.Linear(64, 1, bias=False)
    h, shared, final = torch.randn(5, 64), torch.randn(5, 64), torch.randn(5, 64)
    # Qwen3NextSparseMoeBlock: expert_output + F.sigmoid(self.shared_expert_gate(hidden_states)) * shared_expert_output
    with torch.no_grad():
        want = final + torch.sigmoid(gate(h)) * shared
        gdn._shared_gate_around(None, h, gate.weight.squeeze(), shared, final)
    torch.testing.assert_close(final, want, atol=1e-6, rtol=1e-5)


@pytest.mark.sglang
def test_sglangs_cpu_wrappers_reach_the_ops_and_the_verify_conv_update_needs_the_hook():
    # In a fresh process with the CPU runtime as a server has it: every op registered in sgl_kernel's namespace, and
    # SGLang's own CPU wrappers (sgl_kernel/mamba.py, as gdn_backend calls them) run on them. And the call that stopped
    # MTP speculation for these models on CPU: GDNAttnBackend.forward_extend's TARGET_VERIFY branch passes
    # causal_conv1d_update keywords that the CPU wrapper bound to that name does not take (a TypeError at the first
    # verify), and with cpu_runtime/ops/gdn.py's hook on that name the same call runs.
    import subprocess
    import sys
    import textwrap

    code = textwrap.dedent("""
        import torch
        from sglang_r3.dev.cpu import activate_cpu_runtime, has_gpu
        if not has_gpu():
            activate_cpu_runtime()
        from sglang_r3.cpu_runtime.ops import gdn
        added = gdn.register_gdn_ops()
        assert set(added) == set(gdn.IMPLEMENTATIONS), added
        assert gdn.register_gdn_ops() == []
        from sgl_kernel import mamba
        x = torch.randn(6, 12)
        states = torch.zeros(2, 12, 3)
        w = torch.randn(12, 4)
        cu = torch.tensor([0, 6], dtype=torch.int32)
        out = mamba.causal_conv1d_fn_cpu(x.t(), w, None, "silu", states, torch.tensor([False]),
                                         torch.tensor([1], dtype=torch.int32), cu, [6])
        assert out.shape == (12, 6) and states[1].abs().sum() > 0 and states[0].abs().sum() == 0
        out = mamba.causal_conv1d_update_cpu(torch.randn(1, 12), states, w, None, "silu",
                                             torch.tensor([1], dtype=torch.int32))
        assert out.shape == (1, 12)
        q, k = torch.randn(1, 6, 2, 16), torch.randn(1, 6, 2, 16)
        v = torch.randn(1, 6, 4, 8)
        g, beta = torch.ops.sgl_kernel.fused_gdn_gating_cpu(torch.zeros(4), torch.randn(6, 4), torch.randn(6, 4),
                                                            torch.zeros(4))
        pool = torch.zeros(2, 4, 8, 16)
        o, final, h = mamba.chunk_gated_delta_rule_cpu(q, k, v, g, beta, pool, cu, False, True,
                                                       torch.tensor([0], dtype=torch.int32))
        assert o.shape == (1, 6, 4, 8) and pool[0].abs().sum() > 0 and h is None
        o = torch.ops.sgl_kernel.fused_sigmoid_gating_delta_rule_update_cpu(
            A_log=torch.zeros(4), dt_bias=torch.zeros(4), q=q[:, :1], k=k[:, :1], v=v[:, :1], a=torch.randn(1, 4),
            b=torch.randn(1, 4), initial_state_source=pool, initial_state_indices=torch.tensor([0]),
            cu_seqlens=torch.tensor([0, 1]), use_qk_l2norm_in_kernel=True, softplus_beta=1.0,
            softplus_threshold=20.0)
        assert o.shape == (1, 1, 4, 8)
        import inspect
        from sglang.srt.layers.attention.linear import gdn_backend
        assert gdn_backend.causal_conv1d_update is mamba.causal_conv1d_update_cpu
        params = inspect.signature(gdn_backend.causal_conv1d_update).parameters
        verify = inspect.getsource(gdn_backend.GDNAttnBackend.forward_extend)
        for kw in ("intermediate_conv_window", "intermediate_state_indices", "retrieve_parent_token"):
            assert kw + "=" in verify and kw not in params, kw
        # which is why cpu_runtime/ops/gdn.py hooks that name: with the hook, the verify's call runs (a drafted chain)
        from sglang.srt.plugins.hook_registry import HookRegistry, HookType
        HookRegistry.register(gdn._CONV_UPDATE_TARGET, gdn._conv_update_around, HookType.AROUND)
        HookRegistry.apply_hooks()
        states, windows = torch.zeros(2, 12, 3), torch.zeros(3, 4, 12, 3)
        out = gdn_backend.causal_conv1d_update(
            torch.randn(1, 12, 4), states, w, None, "silu", conv_state_indices=torch.tensor([1], dtype=torch.int32),
            intermediate_conv_window=windows, intermediate_state_indices=torch.tensor([0], dtype=torch.int32),
            retrieve_next_token=None, retrieve_next_sibling=None, retrieve_parent_token=None)
        assert out.shape == (1, 12, 4) and windows[0].abs().sum() > 0 and windows[1:].abs().sum() == 0
        print("REACHED", len(added))
    """)
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=600)
    assert r.returncode == 0 and "REACHED" in r.stdout, r.stdout[-2000:] + r.stderr[-4000:]
