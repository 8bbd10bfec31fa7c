"""The CPU runtime's Mamba-2 kernels (sglang_r3/cpu_runtime/ops/mamba2.py) and Nemotron-H MoE pieces
(sglang_r3/cpu_runtime/families/nemotron_h.py) against transformers 5.19's own torch code for Nemotron-H
(``modeling_nemotron_h``: ``mamba2_chunk_scan`` -- the segment-sum SSD --, ``mamba2_selective_state_update``,
``causal_conv1d_fn`` / ``causal_conv1d_update``, ``NemotronHMoE`` with its ``NemotronHTopkRouter`` and
``NemotronHExperts``), each called through ``__wrapped__``: the torch path, whatever kernels are installed.

Shapes as SGLang's ``MambaMixer2.forward`` hands them over: the prefill tokens of several sequences back to back
(``cu_seqlens`` / ``query_start_loc``), states in a pool of slots (``[heads, head_dim, state_size]``, conv windows
``[dim, width - 1]``), some sequences continuing from their slot's state, sequences that cross the 64-token chunk
boundary, more heads than groups.
"""

from __future__ import annotations

import ast
import importlib.util
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

from sglang_r3.cpu_runtime.ops import mamba2
from sglang_r3.cpu_runtime.families import nemotron_h

pytestmark = pytest.mark.fast

torch.set_num_threads(1)
ATOL = 2e-5


def _modeling():
    from transformers.models.nemotron_h import modeling_nemotron_h

    return modeling_nemotron_h


def _torch_path(fn):
    return getattr(fn, "__wrapped__", fn)


def _ssm_inputs(lengths, H=8, P=4, G=2, N=16, seed=0):
    gen = torch.Generator().manual_seed(seed)
    T = sum(lengths)
    x = torch.randn(1, T, H, P, generator=gen)
    dt = torch.randn(1, T, H, generator=gen)
    A = -torch.rand(H, generator=gen) * 4 - 0.1  # -exp(A_log), as SGLang loads it
    B = torch.randn(1, T, G, N, generator=gen)
    C = torch.randn(1, T, G, N, generator=gen)
    D = torch.randn(H, generator=gen)
    dt_bias = torch.randn(H, generator=gen) * 0.5
    cu = torch.tensor([0] + list(torch.tensor(lengths).cumsum(0)), dtype=torch.int32)
    return x, dt, A, B, C, D, dt_bias, cu


def _pool(slots, H=8, P=4, N=16, seed=1):
    return torch.randn(slots, H, P, N, generator=torch.Generator().manual_seed(seed)) * 0.3


@pytest.mark.parametrize("dt_limit", [(0.0, float("inf")), (0.5, float("inf"))])
def test_prefill_scan_is_transformers_segment_sum_ssd_per_sequence_from_the_state_slots(dt_limit):
    m = _modeling()
    lengths = [150, 5, 64, 1]  # across the chunk boundary, shorter than a chunk, exactly one, a single token
    x, dt, A, B, C, D, dt_bias, cu = _ssm_inputs(lengths)
    pool = _pool(6)
    slots = [4, 1, 2, 5]
    has_initial = torch.tensor([True, False, True, True])
    # As MambaMixer2.forward: each sequence's slot where it continues, zero where it starts.
    initial = torch.where(has_initial[:, None, None, None], pool[slots], 0)
    out = torch.empty_like(x)
    intermediate, final, track = mamba2.mamba_chunk_scan_combined(
        x, dt, A, B, C, chunk_size=128, D=D, dt_bias=dt_bias, initial_states=initial, cu_seqlens=cu,
        dt_softplus=True, dt_limit=dt_limit, out=out, return_varlen_states=True, return_track_states=True,
        state_dtype=torch.float32)
    assert intermediate is None and track is None and final.shape == (4, 8, 4, 16)
    scan = _torch_path(m.mamba2_chunk_scan)
    for n, (s, e) in enumerate(zip(cu[:-1].tolist(), cu[1:].tolist())):
        want_y, want_state = scan(x[:, s:e], dt[:, s:e], A, B[:, s:e], C[:, s:e], chunk_size=128, D=D,
                                  dt_bias=dt_bias, initial_states=initial[n:n + 1], dt_softplus=True,
                                  dt_limit=dt_limit, return_final_states=True)
        torch.testing.assert_close(out[:, s:e], want_y, atol=ATOL, rtol=1e-4)
        torch.testing.assert_close(final[n], want_state[0], atol=ATOL, rtol=1e-4)


def test_decode_update_is_transformers_recurrent_update_in_the_slots_and_continues_the_scan():
    m = _modeling()
    update = _torch_path(m.mamba2_selective_state_update)
    H, P, N, G = 8, 4, 16, 2
    pool = _pool(5)
    before = pool.clone()
    slots = torch.tensor([3, 0, -1])  # -1: a padded row (PAD_SLOT_ID)
    states = {b: pool[int(slots[b])].clone()[None] for b in range(2)}
    for step in range(3):
        x, dt, A, B, C, D, dt_bias, _ = _ssm_inputs([1] * 3, seed=10 + step)
        # As MambaMixer2.forward's decode branch expands them.
        xd, dtd = x[0], dt[0][:, :, None].expand(-1, -1, P)
        A_d = A[:, None, None].expand(-1, P, N)
        D_d, bias_d = D[:, None].expand(-1, P), dt_bias[:, None].expand(-1, P)
        out = torch.empty(3, H, P)
        mamba2.selective_state_update(pool, xd, dtd, A_d, B[0], C[0], D_d, z=None, dt_bias=bias_d, dt_softplus=True,
                                      state_batch_indices=slots, out=out)
        for b in range(2):
            want = update(states[b], xd[b:b + 1], dtd[b:b + 1], A_d, B[0, b:b + 1], C[0, b:b + 1], D_d,
                          dt_bias=bias_d, dt_softplus=True)
            torch.testing.assert_close(out[b], want[0], atol=ATOL, rtol=1e-4)
            torch.testing.assert_close(pool[int(slots[b])], states[b][0], atol=ATOL, rtol=1e-4)
        # a padded row (PAD_SLOT_ID): from a zero state, as the kernel computes it; no slot written
        want = update(torch.zeros(1, H, P, N), xd[2:3], dtd[2:3], A_d, B[0, 2:3], C[0, 2:3], D_d, dt_bias=bias_d,
                      dt_softplus=True)
        torch.testing.assert_close(out[2], want[0], atol=ATOL, rtol=1e-4)
    torch.testing.assert_close(pool[[1, 2, 4]], before[[1, 2, 4]], atol=0, rtol=0)  # other slots untouched

    # A prefill of T tokens then decode steps equals one scan over all of them (the SSD and the recurrence agree).
    x, dt, A, B, C, D, dt_bias, _ = _ssm_inputs([12], seed=20)
    y_all, _ = mamba2.ssd_scan(x[0], F.softplus(dt[0] + dt_bias), A, B[0].repeat_interleave(4, 1),
                               C[0].repeat_interleave(4, 1), torch.zeros(H, P, N), chunk=4)
    state = torch.zeros(1, H, P, N)
    out = torch.empty(1, H, P)
    for t in range(12):
        mamba2.selective_state_update(state, x[0, t:t + 1], dt[0, t:t + 1, :, None].expand(-1, -1, P),
                                      A[:, None, None].expand(-1, P, N), B[0, t:t + 1], C[0, t:t + 1], None,
                                      dt_bias=dt_bias[:, None].expand(-1, P), dt_softplus=True,
                                      state_batch_indices=torch.tensor([0]), out=out)
        torch.testing.assert_close(out[0], y_all[t], atol=ATOL, rtol=1e-4)


def _conv_inputs(lengths, dim=12, width=4, seed=0):
    gen = torch.Generator().manual_seed(seed)
    x = torch.randn(sum(lengths), dim, generator=gen).t()  # [dim, T], the token dim strided as the mixer's view
    weight = torch.randn(dim, width, generator=gen)
    bias = torch.randn(dim, generator=gen)
    qsl = torch.tensor([0] + list(torch.tensor(lengths).cumsum(0)), dtype=torch.int32)
    return x, weight, bias, qsl


def test_prefill_convolution_is_transformers_from_zero_or_the_cached_window():
    m = _modeling()
    conv_fn, conv_update = _torch_path(m.causal_conv1d_fn), _torch_path(m.causal_conv1d_update)
    lengths = [9, 2, 5]
    x, weight, bias, qsl = _conv_inputs(lengths)
    states = torch.randn(4, 12, 3, generator=torch.Generator().manual_seed(3))
    before = states.clone()
    slots = torch.tensor([2, 0, 3], dtype=torch.int32)
    initial = torch.tensor([False, True, True])
    out = mamba2.causal_conv1d_fn(x, weight, bias, activation="silu", conv_states=states, has_initial_state=initial,
                                  cache_indices=slots, query_start_loc=qsl, seq_lens_cpu=lengths)
    for n, (s, e) in enumerate(zip(qsl[:-1].tolist(), qsl[1:].tolist())):
        seq = x[None, :, s:e]
        if initial[n]:  # transformers' update convolves the cached window, then the tokens
            window = before[int(slots[n])][None].clone()
            want = conv_update(seq, window, weight, bias, activation="silu")
        else:
            want = conv_fn(seq, weight, bias, activation="silu")
            window = F.pad(seq, (3, 0))[..., -3:]
        torch.testing.assert_close(out[:, s:e], want[0], atol=ATOL, rtol=1e-4)
        full = torch.cat([before[int(slots[n])][None] if initial[n] else torch.zeros(1, 12, 3), seq], -1)
        torch.testing.assert_close(states[int(slots[n])], full[0, :, -3:], atol=0, rtol=0)
    torch.testing.assert_close(states[1], before[1], atol=0, rtol=0)


def test_decode_convolution_is_transformers_update():
    m = _modeling()
    conv_update = _torch_path(m.causal_conv1d_update)
    _, weight, bias, _ = _conv_inputs([1])
    states = torch.randn(3, 12, 3, generator=torch.Generator().manual_seed(4))
    want_states = states.clone()
    slots = torch.tensor([2, 0], dtype=torch.int32)
    for step in range(3):
        x = torch.randn(2, 12, generator=torch.Generator().manual_seed(30 + step))
        out = mamba2.causal_conv1d_update(x, states, weight, bias, "silu", conv_state_indices=slots)
        for b in range(2):
            window = want_states[int(slots[b])][None]
            want = conv_update(x[b:b + 1, :, None], window, weight, bias, activation="silu")
            torch.testing.assert_close(out[b], want[0, :, 0], atol=ATOL, rtol=1e-4)
            torch.testing.assert_close(states[int(slots[b])], window[0], atol=0, rtol=0)


def test_verify_update_is_transformers_recurrent_update_per_draft_step_and_leaves_the_slot():
    # A target verify (MTP speculation, a chain of T drafts), as MambaMixer2.forward's TARGET_VERIFY branch calls
    # the kernel: x, dt [batch, T, H, P], B, C [batch, T, G, N]; each step's state kept at
    # intermediate_states_buffer[intermediate_state_indices[b], t] for the commit of the accepted drafts, the slot
    # left as it was (disable_state_update). Oracle: transformers' recurrent update, one draft token after another.
    m = _modeling()
    update = _torch_path(m.mamba2_selective_state_update)
    H, P, N, T = 8, 4, 16, 3
    pool = _pool(5)
    before = pool.clone()
    slots = torch.tensor([3, 0, -1])  # -1: a padded row
    x, dt, A, B, C, D, dt_bias, _ = _ssm_inputs([T] * 3, seed=40)
    xv = x[0].view(3, T, H, P)
    dtv = dt[0].view(3, T, H)[..., None].expand(-1, -1, -1, P)
    Bv, Cv = B[0].view(3, T, 2, N), C[0].view(3, T, 2, N)
    A_d = A[:, None, None].expand(-1, P, N)
    D_d, bias_d = D[:, None].expand(-1, P), dt_bias[:, None].expand(-1, P)
    out = torch.empty(3, T, H, P)
    steps = torch.full((3, T, H, P, N), 7.0)
    mamba2.selective_state_update(pool, xv, dtv, A_d, Bv, Cv, D_d, z=None, dt_bias=bias_d, dt_softplus=True,
                                  state_batch_indices=slots, out=out, disable_state_update=True,
                                  intermediate_states_buffer=steps, cache_steps=T,
                                  intermediate_state_indices=torch.arange(3, dtype=torch.int32))
    for b in range(3):
        state = (pool[int(slots[b])].clone() if slots[b] >= 0 else torch.zeros(H, P, N))[None]
        for t in range(T):
            want = update(state, xv[b, t:t + 1], dtv[b, t:t + 1], A_d, Bv[b, t:t + 1], Cv[b, t:t + 1], D_d,
                          dt_bias=bias_d, dt_softplus=True)  # advances ``state`` in place
            torch.testing.assert_close(out[b, t], want[0], atol=ATOL, rtol=1e-4)
            if slots[b] >= 0:
                torch.testing.assert_close(steps[b, t], state[0], atol=ATOL, rtol=1e-4)
    assert (steps[2] == 7.0).all()  # a padded row keeps no step states, as the kernel
    torch.testing.assert_close(pool, before, atol=0, rtol=0)  # the commit, not the verify, writes the slots


def test_verify_convolution_is_transformers_update_per_draft_step_and_keeps_each_window():
    m = _modeling()
    conv_update = _torch_path(m.causal_conv1d_update)
    _, weight, bias, _ = _conv_inputs([1])
    states = torch.randn(3, 12, 3, generator=torch.Generator().manual_seed(5))
    before = states.clone()
    slots = torch.tensor([2, 0], dtype=torch.int32)
    T = 4
    x = torch.randn(2, 12, T, generator=torch.Generator().manual_seed(6))  # [batch, dim, draft], as the mixer
    windows = torch.zeros(2, T, 12, 3)
    out = mamba2.causal_conv1d_update(x, states, weight, bias, "silu", conv_state_indices=slots,
                                      intermediate_conv_window=windows,
                                      intermediate_state_indices=torch.arange(2, dtype=torch.int32))
    for b in range(2):
        window = before[int(slots[b])][None].clone()
        for t in range(T):
            want = conv_update(x[b:b + 1, :, t:t + 1], window, weight, bias, activation="silu")  # advances window
            torch.testing.assert_close(out[b, :, t], want[0, :, 0], atol=ATOL, rtol=1e-4)
            torch.testing.assert_close(windows[b, t], window[0], atol=0, rtol=0)


def test_drafted_trees_and_tracking_calls_are_refused():
    x, dt, A, B, C, D, dt_bias, cu = _ssm_inputs([3])
    with pytest.raises(NotImplementedError, match="extra_buffer"):
        mamba2.mamba_chunk_scan_combined(x, dt, A, B, C, 128, cu_seqlens=cu, return_varlen_states=True,
                                         return_track_states=True, track_seq_idx=torch.tensor([0]),
                                         track_end_locs=torch.tensor([2]))
    with pytest.raises(NotImplementedError, match="topk"):
        mamba2.selective_state_update(_pool(1), x[0, :1], dt[0, :1, :, None].expand(-1, -1, 4),
                                      A[:, None, None].expand(-1, 4, 16), B[0, :1], C[0, :1],
                                      state_batch_indices=torch.tensor([0]), disable_state_update=True,
                                      retrieve_parent_token=torch.zeros(1, 1, dtype=torch.int64))
    with pytest.raises(NotImplementedError, match="topk"):
        mamba2.causal_conv1d_update(torch.randn(1, 12, 2), torch.zeros(1, 12, 3), torch.randn(12, 4),
                                    intermediate_conv_window=torch.zeros(1, 2, 12, 3),
                                    retrieve_next_token=torch.zeros(1, 2, dtype=torch.int64))


@pytest.mark.sglang
def test_the_stand_ins_are_every_kernel_name_mambamixer2_forward_reads_and_are_bound_for_the_call_only():
    # mamba.py read as source: the kernel names its forward reads are the ones it imports from the Mamba kernel
    # modules (the convolutions bound on CUDA / NPU / XPU only).
    path = Path(importlib.util.find_spec("sglang.srt.layers.attention.mamba.mamba").origin)
    tree = ast.parse(path.read_text())
    kernels = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and ("causal_conv1d" in (node.module or "") or
                                                 (node.module or "").endswith("mamba.triton_ops")):
            kernels |= {a.asname or a.name for a in node.names}
    mixer = next(n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == "MambaMixer2")
    forward = next(n for n in mixer.body if isinstance(n, ast.FunctionDef) and n.name == "forward")
    read = {n.id for n in ast.walk(forward) if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Load)}
    assert read & kernels == set(mamba2._STAND_INS)
    # Imported as a CPU server imports it: the convolutions unbound (the NameError a Nemotron-H forward stopped on),
    # the Triton ops bound; inside the hook's binding all six are the torch versions, after it as before.
    code = textwrap.dedent("""
        from sglang_r3.dev.cpu import activate_cpu_runtime, has_gpu
        if not has_gpu():
            activate_cpu_runtime()
        from sglang.srt.layers.attention.mamba import mamba
        from sglang_r3.cpu_runtime.ops import mamba2
        convs = {"causal_conv1d_fn", "causal_conv1d_fn_triton", "causal_conv1d_update", "causal_conv1d_update_triton"}
        before = {n: mamba.__dict__.get(n) for n in mamba2._STAND_INS}
        assert all(before[n] is None for n in convs) and before["mamba_chunk_scan_combined"] is not None, before
        with mamba2._bound():
            assert all(mamba.__dict__[n] is f for n, f in mamba2._STAND_INS.items())
        assert {n: mamba.__dict__.get(n) for n in mamba2._STAND_INS} == before
        print("BOUND")
    """)
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=600)
    assert r.returncode == 0 and "BOUND" in r.stdout, r.stdout[-2000:] + r.stderr[-4000:]


def _tiny_moe(seed=0):
    import transformers

    cfg = transformers.NemotronHConfig(hidden_size=32, n_routed_experts=8, num_experts_per_tok=2,
                                       moe_intermediate_size=16, moe_shared_expert_intermediate_size=16,
                                       routed_scaling_factor=2.5, n_group=1, topk_group=1, norm_topk_prob=True,
                                       hybrid_override_pattern="E")
    torch.manual_seed(seed)
    moe = _modeling().NemotronHMoE(cfg).float().eval()
    with torch.no_grad():
        for p in moe.parameters():
            p.normal_(0.0, 0.3)
        moe.gate.e_score_correction_bias.normal_(0.0, 0.1)
    return moe


def test_relu2_experts_and_float32_router_logits_are_transformers_nemotron_h_moe():
    moe = _tiny_moe()
    h = torch.randn(11, 32, generator=torch.Generator().manual_seed(5))
    with torch.no_grad():
        logits, weights, ids = moe.gate(h)
        # the CPU hook's router logits (cpu_runtime/families/nemotron_h.py) are transformers'
        torch.testing.assert_close(F.linear(h.float(), moe.gate.weight.float()), logits, atol=0, rtol=0)
        want = moe.experts(h, ids, weights)
        # SGLang's TopK leaves the weights unscaled (renormalized); the runner scales the sum by
        # routed_scaling_factor, as the hook does.
        got = nemotron_h.relu2_experts(moe.experts.up_proj, moe.experts.down_proj, h, ids, weights / 2.5, 2.5)
        torch.testing.assert_close(got, want, atol=ATOL, rtol=1e-4)
        # the whole block: routed + shared expert
        torch.testing.assert_close(got + moe.shared_experts(h), moe(h[None])[0], atol=ATOL, rtol=1e-4)
        # another rank's expert (-1, expert parallelism) adds nothing
        dropped = ids.clone()
        dropped[:, 1] = -1
        kept = nemotron_h.relu2_experts(moe.experts.up_proj, moe.experts.down_proj, h, dropped, weights, None)
        one = weights.clone()
        one[:, 1] = 0
        torch.testing.assert_close(kept, moe.experts(h, ids, one), atol=ATOL, rtol=1e-4)
