"""Gated delta-net (Qwen3-Next, Qwen3.5) on the CPU runtime: torch versions of the sgl-kernel ops SGLang's CPU
path calls for it, which the installed (CUDA) sgl-kernel wheel does not register.

SGLang 0.5.23 sends a linear-attention layer on CPU to ``torch.ops.sgl_kernel.*_cpu`` ops, through the python
wrappers of ``sgl_kernel/mamba.py`` and direct reads in ``layers/attention/linear/gdn_backend.py``,
``layers/attention/linear/kernels/gdn_triton.py`` and ``models/qwen3_5.py`` (the last reads four of them when
the module is imported, so without them SGLang's registry skips Qwen3.5 altogether). Each is registered here
in the ``sgl_kernel`` namespace with the schema the wrappers call and the semantics of SGLang's Triton
versions (``sglang/kernels/ops/...``), which the CUDA path runs:

* ``causal_conv1d_fwd_cpu`` / ``causal_conv1d_update_cpu``: the depthwise causal convolution over a prefill
  (per sequence of ``query_start_loc``, after the cached window where ``has_initial_state``) and over decode
  tokens, each leaving the last ``width - 1`` inputs in the request's conv-state slot. Weights are plain
  ``[dim, width]``: SGLang packs them (``is_vnni``) only on an AMX host, where the real kernels exist.
* ``fused_gdn_gating_cpu``: ``g = -exp(A_log) * softplus(a + dt_bias)``, ``beta = sigmoid(b)``.
* ``chunk_gated_delta_rule_cpu``: the gated delta rule over each prefill sequence, chunk by chunk, from the
  request's state slot (the pool zeroes a new request's slot), the final state written back to it.
* ``fused_sigmoid_gating_delta_rule_update_cpu``: the same rule token by token with the gating fused (decode;
  with ``intermediate_states_buffer``, a speculative verify that keeps each step's state and leaves the slot).
* ``fused_sigmoid_mul_cpu``, ``fused_qk_gemma_rmsnorm_cpu``, ``fused_qk_gemma_rmsnorm_with_gate_cpu``,
  ``fused_qkvzba_split_reshape_cat_contiguous_cpu``: Qwen3.5's output gate, its q/k Gemma RMSNorm (weight
  ``1 + w``, float32 inside) with and without the interleaved gate, and its contiguous projection split.

The recurrent state slot is laid out ``[heads_v, head_v_dim, head_k_dim]`` (SGLang's ``Mamba2StateShape``:
``temporal = (num_heads, head_dim, state_size)``, read by the Triton kernels as ``h[v * K + k]``), the
transpose of the ``[.., k, v]`` state of the delta-rule papers and transformers; every op here reads and
writes it that way. Computation is float32, results in the input dtype (states in the pool's).

``FusedRMSNormGated.forward`` / ``layernorm_gated.RMSNorm.forward`` (the gated RMSNorm after the rule) and
``qwen2_moe.fused_gate_sigmoid_mul_add`` (the shared expert's sigmoid gate in the sparse block Qwen3-Next and
Qwen3.5 build from Qwen2-MoE's) run torch on CPU tensors (AROUND hooks, SGLang 0.5.23): without AMX they launch
Triton kernels.

Also, while Qwen3-Next's linear-attention layer is built (an AROUND hook on its ``__init__``):
``torch.get_device_module()`` (no device) answers ``torch.cpu``, as on a CPU-only torch build. With a CUDA build
but no GPU it answers ``torch.cuda``, and the layer builds its gated RMSNorm on ``current_device()`` of it (which
initialises CUDA and fails).
"""

from __future__ import annotations

import functools
from typing import Callable, Dict, List, Optional

import torch
import torch.nn.functional as F
from torch.linalg import solve_triangular

from sglang_r3.seam.swap import swapped


# -- convolution ---------------------------------------------------------------------------------------------


def _conv_window(xin: torch.Tensor, weight: torch.Tensor, bias: Optional[torch.Tensor], n_out: int,
                 silu: bool) -> torch.Tensor:
    """Depthwise causal convolution of ``xin`` [dim, L] (history first): the last ``n_out`` outputs [dim, n_out]."""
    width = weight.shape[-1]
    windows = xin.float().unfold(-1, width, 1)[:, -n_out:]  # [dim, n_out, width]
    out = (windows * weight.float()[:, None, :]).sum(-1)
    if bias is not None:
        out = out + bias.float()[:, None]
    return F.silu(out) if silu else out


def _plain_weight(weight: torch.Tensor) -> torch.Tensor:
    if weight.dim() != 2:
        raise NotImplementedError(
            f"sglang-r3 CPU runtime: causal_conv1d with a packed weight of shape {tuple(weight.shape)} "
            "(SGLang packs conv weights only on an AMX host, where sgl-kernel's own CPU ops exist)")
    return weight


def causal_conv1d_fwd_cpu(x, weight, bias, conv_states, query_start_loc, cache_indices, has_initial_state,
                          silu_activation, pad_slot_id, is_vnni):
    """x [dim, T] (the prefill's tokens of every sequence, back to back) -> out [dim, T]."""
    weight = _plain_weight(weight)
    width = weight.shape[-1]
    dim, total = x.shape
    out = torch.zeros((dim, total), dtype=x.dtype, device=x.device)
    bounds = query_start_loc.tolist() if query_start_loc is not None else [0, total]
    slots = cache_indices.tolist() if cache_indices is not None else list(range(len(bounds) - 1))
    initial = has_initial_state.tolist() if has_initial_state is not None else [False] * len(slots)
    for n, slot in enumerate(slots):
        start, end = bounds[n], bounds[n + 1]
        if slot == pad_slot_id or end == start:
            continue
        state_len = conv_states.shape[-1] if conv_states is not None else width - 1
        if conv_states is not None and initial[n]:
            history = conv_states[slot].to(x.dtype)
        else:
            history = x.new_zeros((dim, state_len))
        xin = torch.cat([history, x[:, start:end]], dim=-1)  # the window before the sequence, then its tokens
        out[:, start:end] = _conv_window(xin, weight, bias, end - start, silu_activation).to(x.dtype)
        if conv_states is not None:
            conv_states[slot] = xin[:, -state_len:].to(conv_states.dtype)
    return out


def causal_conv1d_update_cpu(x, conv_states, weight, bias, silu_activation, cache_seqlens, conv_state_indices,
                             pad_slot_id, is_vnni):
    """x [batch, dim] (one token each) or [batch, dim, seqlen] -> the same shape; each slot's window advances."""
    if cache_seqlens is not None:
        raise NotImplementedError("sglang-r3 CPU runtime: causal_conv1d_update with cache_seqlens (circular state)")
    weight = _plain_weight(weight)
    squeeze = x.dim() == 2
    xs = x.unsqueeze(-1) if squeeze else x
    out = torch.zeros_like(xs)
    state_len = conv_states.shape[-1]
    slots = conv_state_indices.tolist() if conv_state_indices is not None else list(range(xs.shape[0]))
    for b, slot in enumerate(slots):
        if slot == pad_slot_id:
            continue
        xin = torch.cat([conv_states[slot].to(xs.dtype), xs[b]], dim=-1)
        out[b] = _conv_window(xin, weight, bias, xs.shape[-1], silu_activation).to(xs.dtype)
        conv_states[slot] = xin[:, -state_len:].to(conv_states.dtype)
    return out.squeeze(-1) if squeeze else out


# -- the speculative verify's convolution and the commit of accepted drafts -------------------------------------


def causal_conv1d_verify_update(x, conv_states, weight, bias, silu_activation, conv_state_indices,
                                intermediate_conv_window, intermediate_state_indices, pad_slot_id=-1):
    """A target verify's convolution (``gdn_backend.forward_extend``, TARGET_VERIFY), as SGLang's Triton
    ``causal_conv1d_update`` with ``intermediate_conv_window``: x [batch, dim, draft] -> out [batch, dim, draft];
    the window after draft step i (the last ``width - 1`` inputs up to it) at ``[intermediate_state_indices[b], i]``;
    the slot advanced over every draft, as the kernel leaves it (the commit then writes the accepted step's
    window over it). A drafted chain only: start-up refuses ``--speculative-eagle-topk`` > 1 for a model with
    linear-attention layers (``refusals.startup._linear_attention_tree_on_cpu``)."""
    width_m1 = weight.shape[-1] - 1
    slots = conv_state_indices.tolist()
    rows = intermediate_state_indices.tolist()
    windows = {b: conv_states[slot, :, -width_m1:].clone() for b, slot in enumerate(slots) if slot != pad_slot_id}
    out = causal_conv1d_update_cpu(x, conv_states, weight, bias, silu_activation, None, conv_state_indices,
                                   pad_slot_id, False)
    for b, window in windows.items():
        xin = torch.cat([window.to(x.dtype), x[b]], dim=-1)  # [dim, width - 1 + draft]
        for i in range(x.shape[-1]):
            intermediate_conv_window[rows[b], i] = xin[:, i + 1:i + 1 + width_m1].to(intermediate_conv_window.dtype)
    return out


_CONV_UPDATE_TARGET = "sglang.srt.layers.attention.linear.gdn_backend.causal_conv1d_update"


def _conv_update_around(original, x, conv_states, weight, bias, activation, conv_state_indices=None,
                        intermediate_conv_window=None, intermediate_state_indices=None, retrieve_next_token=None,
                        retrieve_next_sibling=None, retrieve_parent_token=None):
    """On CPU the name ``causal_conv1d_update`` is sgl-kernel's wrapper, which takes no verify keywords (the
    TARGET_VERIFY branch passes them): a verify runs ``causal_conv1d_verify_update``, decode the wrapper."""
    if retrieve_next_token is not None or retrieve_next_sibling is not None:
        raise NotImplementedError("sglang-r3 CPU runtime: a drafted tree's verify convolution "
                                  "(--speculative-eagle-topk > 1)")
    if intermediate_conv_window is None:
        return original(x, conv_states, weight, bias, activation, conv_state_indices)
    return causal_conv1d_verify_update(x, conv_states, weight, bias, activation in ("silu", "swish", True),
                                       conv_state_indices, intermediate_conv_window, intermediate_state_indices)


def _scatter_steps(dst, src, dst_rows, steps, src_rows):
    """``dst[:, dst_rows[r]] = src[:, src_rows[r], steps[r]]`` for each request with a step >= 0, skipping rows
    out of range, as SGLang's ``fused_mamba_state_scatter_with_mask`` / ``fused_conv_window_scatter_with_mask``."""
    dst_rows, steps = dst_rows.tolist(), steps.tolist()
    src_rows = src_rows.tolist() if src_rows is not None else list(range(len(steps)))
    for d, s, r in zip(dst_rows, steps, src_rows):
        if s >= 0 and 0 <= d < dst.shape[1] and 0 <= r < src.shape[1] and s < src.shape[2]:
            dst[:, d] = src[:, r, s]


def scatter_mamba_states_after_mtp_verify_cpu(mamba_caches, state_indices_tensor, last_correct_step_indices,
                                              mamba_track_indices, mamba_steps_to_track, src_indices_raw=None):
    """The commit after a verify (``HybridLinearAttnBackend.update_mamba_state_after_mtp_verify``): each request's
    recurrent state and conv windows at its last accepted draft step into its slot, and into its track slot
    where one is tracked; SGLang's Triton scatters (``mamba_state_scatter_triton``) in torch."""
    targets = [(state_indices_tensor, last_correct_step_indices)]
    if mamba_track_indices is not None:
        targets.append((mamba_track_indices, mamba_steps_to_track))
    pairs = [(c, w) for c, w in zip(mamba_caches.conv, mamba_caches.intermediate_conv_window) if c.numel() > 0]
    if mamba_caches.temporal.numel() > 0:
        pairs.insert(0, (mamba_caches.temporal, mamba_caches.intermediate_ssm))
    for dst, src in pairs:
        for rows, steps in targets:
            _scatter_steps(dst, src, rows, steps, src_indices_raw)


_SCATTER_TARGET = "sglang.srt.layers.attention.hybrid_linear_attn_backend.scatter_mamba_states_after_mtp_verify"


def _scatter_around(original, mamba_caches, *args, **kwargs):
    if mamba_caches.temporal.is_cuda:
        return original(mamba_caches, *args, **kwargs)
    return scatter_mamba_states_after_mtp_verify_cpu(mamba_caches, *args, **kwargs)


# -- gating and the delta rule -------------------------------------------------------------------------------


def _gates(A_log, a, b, dt_bias, softplus_beta=1.0, softplus_threshold=20.0):
    g = -torch.exp(A_log.float()) * F.softplus(a.float() + dt_bias.float(), beta=softplus_beta,
                                               threshold=softplus_threshold)
    return g, torch.sigmoid(b.float())


def fused_gdn_gating_cpu(A_log, a, b, dt_bias):
    """a, b [tokens, heads_v] -> (g [1, tokens, heads_v] float32, beta [1, tokens, heads_v] in b's dtype)."""
    g, beta = _gates(A_log, a, b, dt_bias)
    return g.unsqueeze(0), beta.to(b.dtype).unsqueeze(0)


def _l2norm(x: torch.Tensor) -> torch.Tensor:
    return x / torch.sqrt((x * x).sum(-1, keepdim=True) + 1e-6)


def _per_v_head(x: torch.Tensor, heads_v: int) -> torch.Tensor:
    """[T, heads_k, d] -> [T, heads_v, d]: v head h reads k head h // (heads_v // heads_k)."""
    return x.repeat_interleave(heads_v // x.shape[1], dim=1) if x.shape[1] != heads_v else x


def _chunk_rule(q, k, v, g, beta, state, chunk: int = 64):
    """One sequence, float32: q, k [T, H, K] (normalized, q scaled), v [T, H, V], g, beta [T, H], state
    [H, K, V] -> (out [T, H, V], final state [H, K, V]).

    Per chunk from state S0, with c_i the chunk's cumulative log decay and u_i the value written at token i:
    u = (I + A)^-1 (beta v - beta e^c (k S0)), A_ij = beta_i e^(c_i - c_j) k_i.k_j for j < i;
    o_i = e^(c_i) q_i S0 + sum_(j <= i) e^(c_i - c_j) (q_i.k_j) u_j;
    S = e^(c_last) S0 + sum_j e^(c_last - c_j) k_j u_j^T.
    """
    T = q.shape[0]
    out = v.new_empty(v.shape)
    q, k, v, g, beta = (x.transpose(0, 1) for x in (q, k, v, g, beta))  # heads first
    for s in range(0, T, chunk):
        e = min(s + chunk, T)
        qc, kc, vc, bc = q[:, s:e], k[:, s:e], v[:, s:e], beta[:, s:e]
        c = g[:, s:e].cumsum(-1)  # [H, C]
        n = e - s
        lower = torch.ones(n, n, dtype=torch.bool).tril()
        decay = (c[:, :, None] - c[:, None, :]).masked_fill(~lower, float("-inf")).exp()  # e^(c_i - c_j), j <= i
        kk = kc @ kc.transpose(-1, -2)
        system = torch.eye(n) + (bc[:, :, None] * decay * kk).tril(-1)
        rhs = bc[..., None] * (vc - c.exp()[..., None] * (kc @ state))
        u = solve_triangular(system, rhs, upper=False, unitriangular=True)
        out[s:e] = (c.exp()[..., None] * (qc @ state) + ((qc @ kc.transpose(-1, -2)) * decay) @ u).transpose(0, 1)
        last = c[:, -1:]
        state = last.exp()[..., None] * state + (kc * (last - c).exp()[..., None]).transpose(-1, -2) @ u
    return out, state


def _qk_per_v_head(q, k, heads_v: int, l2norm: bool, scale: Optional[float]):
    """q scaled (by ``scale``, default 1/sqrt(K)) and k, both L2-normed if asked, repeated per value head."""
    if l2norm:
        q, k = _l2norm(q), _l2norm(k)
    q = q * (scale if scale is not None else q.shape[-1] ** -0.5)
    return _per_v_head(q, heads_v), _per_v_head(k, heads_v)


def chunk_gated_delta_rule_cpu(query, key, value, g, beta, initial_state, output_final_state, cu_seqlens,
                               head_first, use_qk_l2norm_in_kernel, initial_state_indices):
    """query, key [1, T, H, K], value [1, T, HV, V], g, beta [1, T, HV]; ``initial_state`` the state pool
    [slots, HV, V, K] read at ``initial_state_indices`` and written back there -> (out [1, T, HV, V], final
    states [sequences, HV, V, K])."""
    if head_first:
        raise NotImplementedError("sglang-r3 CPU runtime: chunk_gated_delta_rule with head_first=True")
    q, k, v = query[0].float(), key[0].float(), value[0].float()
    heads_v = v.shape[1]
    q, k = _qk_per_v_head(q, k, heads_v, use_qk_l2norm_in_kernel, None)
    gg, bb = g[0].float(), beta[0].float()
    bounds = cu_seqlens.tolist()
    slots = initial_state_indices.tolist() if initial_state_indices is not None else list(range(len(bounds) - 1))
    out = torch.zeros_like(v)
    finals = []
    for n, slot in enumerate(slots):
        start, end = bounds[n], bounds[n + 1]
        state = initial_state[slot].float().transpose(-1, -2) if slot >= 0 else v.new_zeros(
            (heads_v, k.shape[-1], v.shape[-1]))
        o, state = _chunk_rule(q[start:end], k[start:end], v[start:end], gg[start:end], bb[start:end], state)
        out[start:end] = o
        finals.append(state.transpose(-1, -2))
        if slot >= 0:
            initial_state[slot] = state.transpose(-1, -2).to(initial_state.dtype)
    final = torch.stack(finals) if finals else initial_state.new_zeros((0, *initial_state.shape[1:]))
    return out.to(value.dtype).unsqueeze(0), final.to(initial_state.dtype)


def fused_sigmoid_gating_delta_rule_update_cpu(A_log, dt_bias, q, k, v, a, b, initial_state_source,
                                               initial_state_indices, cu_seqlens=None, use_qk_l2norm_in_kernel=False,
                                               softplus_beta=1.0, softplus_threshold=20.0, scale=None, is_kda=False,
                                               disable_state_update=False, intermediate_states_buffer=None,
                                               intermediate_state_indices=None, cache_steps=None,
                                               retrieve_parent_token=None):
    """q, k [1, T, H, K], v [1, T, HV, V], a, b [T, HV]: the rule token by token per sequence of ``cu_seqlens``
    from its state slot -> out [1, T, HV, V]. Decode writes each sequence's last state back; a verify
    (``intermediate_states_buffer``) keeps step i's state at ``[intermediate_state_indices[n], i]`` instead,
    and with ``retrieve_parent_token`` a token continues from its parent's state (a drafted tree)."""
    if is_kda:
        raise NotImplementedError("sglang-r3 CPU runtime: the KDA (per-channel gate) delta rule")
    qq, kk, vv = q[0].float(), k[0].float(), v[0].float()
    heads_v = vv.shape[1]
    qq, kk = _qk_per_v_head(qq, kk, heads_v, use_qk_l2norm_in_kernel, scale)
    g, beta = _gates(A_log, a.reshape(-1, heads_v), b.reshape(-1, heads_v), dt_bias, softplus_beta,
                     softplus_threshold)
    total = vv.shape[0]
    bounds = cu_seqlens.tolist() if cu_seqlens is not None else list(range(total + 1))
    slots = initial_state_indices.tolist()
    inter = intermediate_state_indices.tolist() if intermediate_state_indices is not None else None
    parents = retrieve_parent_token.tolist() if retrieve_parent_token is not None else None
    out = torch.zeros_like(vv)
    for n, slot in enumerate(slots):
        start, end = bounds[n], bounds[n + 1]
        h0 = initial_state_source[slot].float().transpose(-1, -2) if slot >= 0 else vv.new_zeros(
            (heads_v, kk.shape[-1], vv.shape[-1]))
        states: List[torch.Tensor] = []
        state = h0
        for i, t in enumerate(range(start, end)):
            if parents is not None:
                p = parents[n][i]
                state = states[p] if p >= 0 else h0
            state = state * g[t].exp()[:, None, None]
            delta = (vv[t] - (state * kk[t][:, :, None]).sum(1)) * beta[t][:, None]
            state = state + kk[t][:, :, None] * delta[:, None, :]
            out[t] = (state * qq[t][:, :, None]).sum(1)
            states.append(state)
            if intermediate_states_buffer is not None and inter is not None and inter[n] >= 0:
                intermediate_states_buffer[inter[n], i] = state.transpose(-1, -2).to(intermediate_states_buffer.dtype)
        if slot >= 0 and not disable_state_update and intermediate_states_buffer is None and states:
            initial_state_source[slot] = state.transpose(-1, -2).to(initial_state_source.dtype)
    return out.to(v.dtype).unsqueeze(0)


# -- Qwen3.5's attention helpers -----------------------------------------------------------------------------


def fused_sigmoid_mul_cpu(x, gate):
    """x [tokens, heads * d] *= sigmoid(gate) (gate [tokens, heads, d] or x's shape), in place."""
    gate = gate.reshape(x.shape)
    x.copy_((x.float() * torch.sigmoid(gate.float())).to(x.dtype))


def _gemma_rms(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    h = x.float()
    h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + eps)
    return (h * (1.0 + weight.float())).to(x.dtype)


def fused_qk_gemma_rmsnorm_cpu(q, k, q_weight, k_weight, eps, head_dim):
    """-> (q [tokens * heads, head_dim], k [tokens * kv_heads, head_dim]), each head normalized."""
    return (_gemma_rms(q.reshape(-1, head_dim), q_weight, eps).contiguous(),
            _gemma_rms(k.reshape(-1, head_dim), k_weight, eps).contiguous())


def fused_qk_gemma_rmsnorm_with_gate_cpu(q_gate, k, q_weight, k_weight, eps, head_dim, num_heads):
    """q_gate [tokens, heads * 2 * head_dim], per head [q | gate] -> (q normalized, k normalized, gate), each
    [rows, head_dim]."""
    qg = q_gate.reshape(q_gate.shape[0], num_heads, 2 * head_dim)
    q, gate = qg[..., :head_dim], qg[..., head_dim:]
    qn, kn = fused_qk_gemma_rmsnorm_cpu(q, k, q_weight, k_weight, eps, head_dim)
    return qn, kn, gate.reshape(-1, head_dim).contiguous()


def fused_qkvzba_split_reshape_cat_contiguous_cpu(mixed_qkvz, mixed_ba, num_heads_qk, num_heads_v, head_qk, head_v):
    """[all_q | all_k | all_v | all_z] and [all_b | all_a] -> (mixed_qkv [T, q+k+v], z [T, heads_v, head_v],
    b [T, heads_v], a [T, heads_v])."""
    qkv = 2 * num_heads_qk * head_qk + num_heads_v * head_v
    tokens = mixed_qkvz.shape[0]
    mixed_qkv = mixed_qkvz[:, :qkv].contiguous()
    z = mixed_qkvz[:, qkv:qkv + num_heads_v * head_v].reshape(tokens, num_heads_v, head_v).contiguous()
    b = mixed_ba[:, :num_heads_v].contiguous()
    a = mixed_ba[:, num_heads_v:2 * num_heads_v].contiguous()
    return mixed_qkv, z, b, a


# -- the gated RMSNorm after the delta rule -------------------------------------------------------------------

_NORM_TARGET = "sglang.kernels.ops.attention.fla.fused_norm_gate.FusedRMSNormGated.forward"  # Qwen3-Next
_NORM_GROUPED_TARGET = "sglang.kernels.ops.attention.fla.layernorm_gated.RMSNorm.forward"  # Qwen3.5


def _gated_rms(x, z, weight, eps, activation="swish", group_size=None, norm_before_gate=True):
    """As SGLang's Triton kernels (layernorm_gated.py / fused_norm_gate.py, RMS variant): with a gate z,
    ``norm(x) * act(z)`` (``norm_before_gate``) or ``norm(x * act(z))``; act is silu (``swish`` / ``silu``)
    or sigmoid; ``group_size`` normalizes each group of that many channels apart. Float32 inside."""
    h = x.float()
    if z is not None:
        gate = z.float()
        act = torch.sigmoid(gate) if activation == "sigmoid" else F.silu(gate)
        if not norm_before_gate:
            h = h * act
    shape = h.shape
    groups = h.reshape(*shape[:-1], -1, group_size or shape[-1])
    h = (groups * torch.rsqrt(groups.pow(2).mean(-1, keepdim=True) + eps)).reshape(shape)
    if weight is not None:
        h = h * weight.float()
    if z is not None and norm_before_gate:
        h = h * act
    return h.to(x.dtype)


def _gated_norm_around(original, self, x, g, residual=None, prenorm=False, residual_in_fp32=False):
    """``FusedRMSNormGated`` sends a CPU tensor to sgl-kernel's AMX op or else to its Triton kernel (no CPU
    driver): on CPU, ``rmsnorm(x) * weight * act(g)``."""
    if x.is_cuda:
        return original(self, x, g, residual, prenorm, residual_in_fp32)
    if residual is not None or prenorm:
        raise NotImplementedError("sglang-r3 CPU runtime: FusedRMSNormGated with a residual")
    if getattr(self, "bias", None) is not None:  # a registered None parameter in 0.5.23
        raise NotImplementedError("sglang-r3 CPU runtime: FusedRMSNormGated with a bias")
    return _gated_rms(x, g, self.weight, self.eps, self.activation)


def _grouped_norm_around(original, self, x, z=None):
    """``layernorm_gated.RMSNorm`` (Qwen3.5's gated norm) likewise, with its group size and gate order."""
    if x.is_cuda:
        return original(self, x, z)
    if getattr(self, "bias", None) is not None:
        raise NotImplementedError("sglang-r3 CPU runtime: layernorm_gated.RMSNorm with a bias")
    return _gated_rms(x, z, self.weight, self.eps, self.activation, self.group_size, self.norm_before_gate)


# -- the shared expert's gate (Qwen2-MoE's sparse block, which Qwen3-Next and Qwen3.5 build) ------------------

_SHARED_GATE_TARGET = "sglang.srt.models.qwen2_moe.fused_gate_sigmoid_mul_add"


def _shared_gate_around(original, hidden_states, gate_weight, shared_output, final_hidden_states):
    """``final += sigmoid(hidden . gate_weight) * shared``, which SGLang launches as a Triton kernel on every
    device but AMX CPUs and NPUs; torch (float32 inside) on CPU tensors."""
    if hidden_states.is_cuda:
        return original(hidden_states, gate_weight, shared_output, final_hidden_states)
    gate = torch.sigmoid(hidden_states.float() @ gate_weight.float().reshape(-1, 1))
    added = final_hidden_states.float() + gate * shared_output.float()
    final_hidden_states.copy_(added.to(final_hidden_states.dtype))


def hooks(model_ports: bool):
    """AROUND hooks (the norms and the speculative verify: SGLang 0.5.23, where they live in ``sglang.kernels``;
    Qwen3-Next and Qwen3.5 are not served on 0.5.15's CPU runtime: start-up refuses them there, in
    startup_checks._release_cpu_runtime. The shared expert's gate: both releases, for Qwen2-MoE). Whether the
    model ports apply (``release.cpu_model_ports_apply``) is the caller's to say: the manifest's tool registers
    this module's ops."""
    if not model_ports:
        return [(_SHARED_GATE_TARGET, _shared_gate_around)]
    out = [(_NORM_TARGET, _gated_norm_around), (_NORM_GROUPED_TARGET, _grouped_norm_around),
           (_SHARED_GATE_TARGET, _shared_gate_around), (_LAYER_TARGET, _layer_init_around),
           (_SCATTER_TARGET, _scatter_around)]
    if _binds_cpu_wrapper():
        out.append((_CONV_UPDATE_TARGET, _conv_update_around))
    return out


def _binds_cpu_wrapper() -> bool:
    """Whether gdn_backend binds ``causal_conv1d_update`` to sgl-kernel's CPU wrapper in this process: it does where
    SGLang's (cached) ``is_cpu()`` held. A launching process that asked it before the CPU runtime was prepared
    (``python -m sglang.launch_server`` on a CPU host) binds the Triton kernel, which takes the verify keywords
    itself and runs no forward there; the scheduler processes it starts inherit the CPU engine and bind the wrapper."""
    from sglang.srt.utils import is_cpu

    return is_cpu()


# name -> (schema, implementation): the arguments as SGLang's wrappers and call sites pass them.
_OPS: Dict[str, tuple] = {
    "causal_conv1d_fwd_cpu": (
        "(Tensor x, Tensor weight, Tensor? bias, Tensor(a!)? conv_states, Tensor? query_start_loc, "
        "Tensor? cache_indices, Tensor? has_initial_state, bool silu_activation, int pad_slot_id, "
        "bool is_vnni) -> Tensor",
        causal_conv1d_fwd_cpu,
    ),
    "causal_conv1d_update_cpu": (
        "(Tensor x, Tensor(a!) conv_states, Tensor weight, Tensor? bias, bool silu_activation, "
        "Tensor? cache_seqlens, Tensor? conv_state_indices, int pad_slot_id, bool is_vnni) -> Tensor",
        causal_conv1d_update_cpu,
    ),
    "fused_gdn_gating_cpu": (
        "(Tensor A_log, Tensor a, Tensor b, Tensor dt_bias) -> (Tensor, Tensor)",
        fused_gdn_gating_cpu,
    ),
    "chunk_gated_delta_rule_cpu": (
        "(Tensor query, Tensor key, Tensor value, Tensor g, Tensor beta, Tensor(a!) initial_state, "
        "bool output_final_state, Tensor cu_seqlens, bool head_first, bool use_qk_l2norm_in_kernel, "
        "Tensor? initial_state_indices) -> (Tensor, Tensor)",
        chunk_gated_delta_rule_cpu,
    ),
    "fused_sigmoid_gating_delta_rule_update_cpu": (
        "(Tensor A_log, Tensor dt_bias, Tensor q, Tensor k, Tensor v, Tensor a, Tensor b, "
        "Tensor(a!) initial_state_source, Tensor initial_state_indices, Tensor? cu_seqlens=None, "
        "bool use_qk_l2norm_in_kernel=False, float softplus_beta=1.0, float softplus_threshold=20.0, "
        "float? scale=None, bool is_kda=False, bool disable_state_update=False, "
        "Tensor(b!)? intermediate_states_buffer=None, Tensor? intermediate_state_indices=None, "
        "int? cache_steps=None, Tensor? retrieve_parent_token=None) -> Tensor",
        fused_sigmoid_gating_delta_rule_update_cpu,
    ),
    "fused_sigmoid_mul_cpu": ("(Tensor(a!) x, Tensor gate) -> ()", fused_sigmoid_mul_cpu),
    "fused_qk_gemma_rmsnorm_cpu": (
        "(Tensor q, Tensor k, Tensor q_weight, Tensor k_weight, float eps, int head_dim) -> (Tensor, Tensor)",
        fused_qk_gemma_rmsnorm_cpu,
    ),
    "fused_qk_gemma_rmsnorm_with_gate_cpu": (
        "(Tensor q_gate, Tensor k, Tensor q_weight, Tensor k_weight, float eps, int head_dim, int num_heads) "
        "-> (Tensor, Tensor, Tensor)",
        fused_qk_gemma_rmsnorm_with_gate_cpu,
    ),
    "fused_qkvzba_split_reshape_cat_contiguous_cpu": (
        "(Tensor mixed_qkvz, Tensor mixed_ba, int num_heads_qk, int num_heads_v, int head_qk, int head_v) "
        "-> (Tensor, Tensor, Tensor, Tensor)",
        fused_qkvzba_split_reshape_cat_contiguous_cpu,
    ),
}

IMPLEMENTATIONS: Dict[str, Callable] = {name: fn for name, (_, fn) in _OPS.items()}


def register_gdn_ops() -> list:
    """Register every gated delta-net op the loaded sgl-kernel lacks; returns the names added. Idempotent."""
    from sglang_r3.cpu_runtime.ops.spec_ops import register_missing_ops

    return register_missing_ops(_OPS)


_LAYER_TARGET = "sglang.srt.models.qwen3_next.Qwen3GatedDeltaNet.__init__"


def _cpu_device_module(real):
    @functools.wraps(real)
    def get_device_module(device=None):
        return torch.cpu if device is None else real(device)

    return get_device_module


def _layer_init_around(original, self, *args, **kwargs):
    """Qwen3-Next's linear-attention layer builds its gated RMSNorm on ``torch.get_device_module().current_device()``:
    with a CUDA build of torch but no GPU that is ``torch.cuda`` (CUDA initialises and fails). For the call only, and
    only without CUDA, no-device ``torch.get_device_module()`` answers ``torch.cpu``, as on a CPU-only torch build."""
    if torch.cuda.is_available():
        return original(self, *args, **kwargs)
    with swapped(torch, "get_device_module", _cpu_device_module(torch.get_device_module)):
        return original(self, *args, **kwargs)
