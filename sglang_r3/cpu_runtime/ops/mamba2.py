"""Mamba-2 (Nemotron-H) on the CPU runtime: torch versions of the kernels SGLang 0.5.23's ``MambaMixer2.forward``
(``layers/attention/mamba/mamba.py``) calls, which have no CPU version.

``MambaMixer2.forward`` reads four module globals of ``mamba.py``:

* ``causal_conv1d_fn_triton`` / ``causal_conv1d_update_triton`` (Nemotron-H asks for the Triton convolution:
  ``use_triton_causal_conv=True``), and ``causal_conv1d_fn`` / ``causal_conv1d_update`` otherwise: ``mamba.py``
  binds them only when it is imported on CUDA, NPU or XPU (``sglang.kernels.ops.mamba.causal_conv1d_triton``'s
  functions on CUDA); on a CPU host the names do not exist and the first Mamba layer stops on a ``NameError``.
* ``mamba_chunk_scan_combined`` and ``selective_state_update`` (``sglang.kernels.ops.mamba.triton_ops``): Triton
  kernels, which have no CPU target.

An AROUND hook on ``MambaMixer2.forward`` binds those six names to the torch versions below for the call, on CPU
tensors only, and runs SGLang's own forward (its projections, splits, state-slot bookkeeping and gated RMSNorm,
whose ``forward_native`` is torch). Each takes the arguments the mixer passes, with the semantics of the kernel it
stands in for:

* ``causal_conv1d_fn``: the depthwise causal convolution over a prefill, per sequence of ``query_start_loc``,
  after the request's cached window where ``has_initial_state``, leaving its last ``width - 1`` inputs in the
  slot (cpu_runtime/ops/gdn.py's ``causal_conv1d_fwd_cpu``, the same semantics for gated delta-net's convolution).
* ``causal_conv1d_update``: one decode token per request, each slot's window advanced (cpu_runtime/ops/gdn.py's
  ``causal_conv1d_update_cpu``).
* ``mamba_chunk_scan_combined``: the SSD scan (state-space duality: Mamba-2's selective scan computed chunk by
  chunk) over each prefill sequence of ``cu_seqlens`` from its initial state (``dt = softplus(dt + dt_bias)``
  clamped to ``dt_limit``; ``h_t = exp(dt_t A) h_(t-1) + dt_t B_t x_t``; ``y_t = C_t h_t + D x_t``), the output
  written into ``out`` and each sequence's final state returned (``return_varlen_states``).
* ``selective_state_update``: the same recurrence for one decode token per request, from and back into its slot.

The state slot is ``[heads, head_dim, state_size]`` (SGLang's ``Mamba2StateShape``: ``temporal = (num_heads,
head_dim, state_size)``, as transformers' recurrent state). Computation is float32, results in the input dtype
(states in the pool's). Checked against transformers' torch code (``modeling_nemotron_h``: its segment-sum chunk
scan, recurrent update, convolutions and gated norm) in tests/test_cpu_mamba2.py.

A target verify (MTP speculation, a drafted chain) runs the same two stand-ins with the kernels' verify arguments: each
draft step's convolution window and recurrent state kept for the commit of the accepted drafts (cpu_runtime/ops/gdn.py's
scatter, the commit gated delta-net's verify shares), the slot's state left as it was. Not served on the CPU
runtime, raising where asked (the scheduler stops; no row is served): a drafted tree (``--speculative-eagle-topk``
> 1, which start-up refuses for a model with linear-attention layers: startup
``_linear_attention_tree_on_cpu``), the radix cache's mamba state tracking (``--mamba-radix-cache-strategy
extra_buffer``).
"""

from __future__ import annotations

import contextlib
import importlib
from typing import Any, Dict, Iterator, Optional

import torch
import torch.nn.functional as F

from sglang_r3.cpu_runtime.ops.gdn import (causal_conv1d_fwd_cpu, causal_conv1d_update_cpu,
                                               causal_conv1d_verify_update)

_MAMBA = "sglang.srt.layers.attention.mamba.mamba"
_FORWARD_TARGET = f"{_MAMBA}.MambaMixer2.forward"

PAD_SLOT_ID = -1  # SGLang's (kernels/ops/mamba/causal_conv1d_triton.py and triton_ops/mamba_ssm.py)


def _silu(activation) -> bool:
    if activation in (None, False):
        return False
    if activation in (True, "silu", "swish"):
        return True
    raise NotImplementedError(f"sglang-r3 CPU runtime: causal_conv1d with activation {activation!r}")


# -- convolution ---------------------------------------------------------------------------------------------------


def causal_conv1d_fn(x, weight, bias, conv_states, query_start_loc, seq_lens_cpu=None, cache_indices=None,
                     has_initial_state=None, activation="silu", pad_slot_id=PAD_SLOT_ID, validate_data=False,
                     block_table=None, **kwargs):
    """x [dim, T] (every prefill sequence's tokens, back to back) -> out [dim, T]; each sequence's slot keeps its
    last ``width - 1`` inputs."""
    if block_table is not None:
        raise NotImplementedError("sglang-r3 CPU runtime: causal_conv1d_fn with a block table (page-major states)")
    return causal_conv1d_fwd_cpu(x, weight, bias, conv_states, query_start_loc, cache_indices, has_initial_state,
                                 _silu(activation), pad_slot_id, False)


def causal_conv1d_update(x, conv_state, weight, bias=None, activation=None, cache_seqlens=None,
                         conv_state_indices=None, num_accept_tokens=None, intermediate_conv_window=None,
                         intermediate_state_indices=None, retrieve_next_token=None, retrieve_next_sibling=None,
                         retrieve_parent_token=None, pad_slot_id=PAD_SLOT_ID, metadata=None, validate_data=False):
    """Decode: x [batch, dim] (one token each) -> [batch, dim]; each slot's window advances. A target verify
    (``intermediate_conv_window`` given): x [batch, dim, draft] -> [batch, dim, draft], each draft step's window
    kept for the commit of the accepted ones (cpu_runtime/ops/gdn.py's ``causal_conv1d_verify_update``: the same kernel call,
    gated delta-net's verify). A drafted chain only: SGLang passes the retrieve_* trees for
    ``--speculative-eagle-topk`` > 1, which raise here (start-up refuses them first)."""
    if num_accept_tokens is not None or retrieve_next_token is not None or retrieve_next_sibling is not None \
            or retrieve_parent_token is not None:
        raise NotImplementedError("sglang-r3 CPU runtime: a Mamba-2 convolution over a drafted tree "
                                  "(--speculative-eagle-topk > 1) or with accepted-token counts")
    if intermediate_conv_window is not None:
        return causal_conv1d_verify_update(x, conv_state, weight, bias, _silu(activation), conv_state_indices,
                                           intermediate_conv_window, intermediate_state_indices, pad_slot_id)
    return causal_conv1d_update_cpu(x, conv_state, weight, bias, _silu(activation), cache_seqlens,
                                    conv_state_indices, pad_slot_id, False)


# -- the SSD scan --------------------------------------------------------------------------------------------------


def _dt(dt: torch.Tensor, dt_bias: Optional[torch.Tensor], softplus: bool, limit=(0.0, float("inf"))):
    dt = dt.float()
    if dt_bias is not None:
        dt = dt + dt_bias.float()
    if softplus:
        dt = F.softplus(dt)
    if limit != (0.0, float("inf")):
        dt = dt.clamp(min=limit[0], max=limit[1])
    return dt


def _per_head(t: torch.Tensor, heads: int) -> torch.Tensor:
    """[..., groups, N] -> [..., heads, N]: head h reads group h // (heads // groups)."""
    return t.repeat_interleave(heads // t.shape[-2], dim=-2) if t.shape[-2] != heads else t


def ssd_scan(x, dt, A, B, C, state, chunk: int = 64):
    """One sequence, float32: x [T, H, P], dt [T, H] (discretization steps), A [H] (negative), B, C [T, H, N],
    state [H, P, N] -> (y [T, H, P] without the D skip, final state [H, P, N]).

    Per chunk from state S0, with c_i the chunk's cumulative log decay (sum of dt A up to token i):
    y_i = e^(c_i) C_i S0 + sum_(j <= i) e^(c_i - c_j) (C_i . B_j) dt_j x_j;
    S = e^(c_last) S0 + sum_j e^(c_last - c_j) dt_j x_j B_j^T.
    """
    T = x.shape[0]
    y = x.new_empty(x.shape)
    for s in range(0, T, chunk):
        e = min(s + chunk, T)
        n = e - s
        xs, Bs, Cs = x[s:e], B[s:e], C[s:e]
        c = (dt[s:e] * A).cumsum(0)  # [n, H]
        lower = torch.ones(n, n, dtype=torch.bool).tril()
        decay = (c[:, None, :] - c[None, :, :]).masked_fill(~lower[..., None], float("-inf")).exp()  # [i, j, H]
        scores = torch.einsum("ihn,jhn->ijh", Cs, Bs) * decay  # [i, j, H]
        xdt = xs * dt[s:e, :, None]  # [n, H, P]
        y[s:e] = torch.einsum("ijh,jhp->ihp", scores, xdt) + torch.einsum("ihn,hpn->ihp", Cs, state) * c.exp()[..., None]
        last = c[-1]  # [H]
        state = last.exp()[:, None, None] * state + torch.einsum("jh,jhp,jhn->hpn", (last - c).exp(), xdt, Bs)
    return y, state


def mamba_chunk_scan_combined(x, dt, A, B, C, chunk_size, D=None, z=None, dt_bias=None, initial_states=None,
                              seq_idx=None, chunk_indices=None, chunk_offsets=None, cu_seqlens=None,
                              dt_softplus=False, dt_limit=(0.0, float("inf")), out=None, return_final_states=False,
                              return_varlen_states=False, return_intermediate_states=False, state_dtype=None,
                              return_track_states=False, track_seq_idx=None, track_end_locs=None):
    """x [1, T, H, P], dt [1, T, H], A [H], B, C [1, T, G, N], ``initial_states`` [sequences, H, P, N] (or None: zero),
    ``cu_seqlens`` the sequences' bounds -> ``out`` [1, T, H, P] written; returns what the mixer unpacks:
    (per-chunk states: None, the sequences' final states [sequences, H, P, N], tracked states: None)."""
    if z is not None:
        raise NotImplementedError("sglang-r3 CPU runtime: mamba_chunk_scan_combined with a gate z")
    if track_end_locs is not None and track_end_locs.numel() > 0:
        raise NotImplementedError("sglang-r3 CPU runtime: Mamba-2 state tracking for the radix cache "
                                  "(--mamba-radix-cache-strategy extra_buffer)")
    if not (return_varlen_states and return_track_states) or return_final_states or return_intermediate_states:
        raise NotImplementedError("sglang-r3 CPU runtime: mamba_chunk_scan_combined as MambaMixer2.forward calls it "
                                  "(varlen final states, the track-states return) only")
    if x.shape[0] != 1:
        raise NotImplementedError("sglang-r3 CPU runtime: mamba_chunk_scan_combined over a batch dimension")
    heads, head_dim = x.shape[-2], x.shape[-1]
    xs = x[0].float()
    steps = _dt(dt[0], dt_bias, dt_softplus, tuple(dt_limit))
    a = A.float()
    Bh, Ch = _per_head(B[0].float(), heads), _per_head(C[0].float(), heads)
    bounds = cu_seqlens.tolist() if cu_seqlens is not None else [0, xs.shape[0]]
    y = torch.zeros_like(xs)
    finals = []
    for n in range(len(bounds) - 1):
        s, e = bounds[n], bounds[n + 1]
        state = (initial_states[n].float() if initial_states is not None
                 else xs.new_zeros((heads, head_dim, Bh.shape[-1])))
        if e > s:
            y[s:e], state = ssd_scan(xs[s:e], steps[s:e], a, Bh[s:e], Ch[s:e], state)
        finals.append(state)
    if D is not None:
        d = D.float()
        y = y + xs * (d[:, None] if d.dim() == 1 else d)
    result = y.to(x.dtype).unsqueeze(0)
    if out is not None:
        out.copy_(result.view(out.shape))
    dtype = state_dtype if state_dtype is not None else C.dtype
    varlen = torch.stack(finals).to(dtype) if finals else x.new_zeros((0, heads, head_dim, B.shape[-1]), dtype=dtype)
    return None, varlen, None


def selective_state_update(state, x, dt, A, B, C, D=None, z=None, dt_bias=None, dt_softplus=False,
                           state_batch_indices=None, pad_slot_id=PAD_SLOT_ID, out=None, disable_state_update=False,
                           intermediate_states_buffer=None, cache_steps=None, retrieve_parent_token=None,
                           intermediate_state_indices=None):
    """state [slots, H, P, N]; decode: x [batch, H, P], dt [batch, H, P], B, C [batch, G, N]; a target verify:
    x, dt [batch, T, H, P], B, C [batch, T, G, N] (T draft steps from the slot's state). A [H, P, N], D, dt_bias
    [H, P] -> ``out`` written. As the Triton kernel (``_selective_scan_update_kernel``): each step's state into
    ``intermediate_states_buffer[intermediate_state_indices[b], t]`` where given (the commit of accepted drafts reads
    it), the slot advanced over every step unless ``disable_state_update``; a padded row (``pad_slot_id``) computed
    from a zero state, nothing stored. A drafted chain only (``retrieve_parent_token``: a tree, refused)."""
    if retrieve_parent_token is not None:
        raise NotImplementedError("sglang-r3 CPU runtime: a Mamba-2 state update over a drafted tree "
                                  "(--speculative-eagle-topk > 1)")
    if z is not None:
        raise NotImplementedError("sglang-r3 CPU runtime: selective_state_update with a gate z")
    steps_dim = x.dim() == 4
    if x.dim() not in (3, 4):
        raise NotImplementedError(f"sglang-r3 CPU runtime: selective_state_update on x of shape {tuple(x.shape)}")
    if not steps_dim:
        x, dt, B, C = x[:, None], dt[:, None], B[:, None], C[:, None]
    heads = x.shape[2]
    steps = _dt(dt, dt_bias, dt_softplus)  # [batch, T, H, P]
    Bh, Ch = _per_head(B.float(), heads), _per_head(C.float(), heads)  # [batch, T, H, N]
    a = A.float()
    slots = state_batch_indices.tolist() if state_batch_indices is not None else list(range(x.shape[0]))
    cache_rows = (intermediate_state_indices.tolist() if intermediate_state_indices is not None else slots)
    y = torch.zeros(x.shape, dtype=torch.float32)
    for b, slot in enumerate(slots):
        padded = slot == pad_slot_id  # as the kernel: computed from a zero state, the state not stored
        h = state.new_zeros(state.shape[1:], dtype=torch.float32) if padded else state[slot].float()
        for t in range(x.shape[1]):
            dt_t = steps[b, t]
            h = h * torch.exp(dt_t[..., None] * a) + (dt_t * x[b, t].float())[..., None] * Bh[b, t][:, None, :]
            y[b, t] = (h * Ch[b, t][:, None, :]).sum(-1)
            if intermediate_states_buffer is not None and not padded:
                intermediate_states_buffer[cache_rows[b], t] = h.to(intermediate_states_buffer.dtype)
        if not padded and not disable_state_update:
            state[slot] = h.to(state.dtype)
    if D is not None:
        y = y + x.float() * D.float()
    if not steps_dim:
        y = y[:, 0]
    if out is None:
        return y.to(x.dtype)
    out.copy_(y.to(out.dtype).view(out.shape))
    return None


# -- the hook ------------------------------------------------------------------------------------------------------

# mamba.py's module globals MambaMixer2.forward calls -> the torch versions above.
_STAND_INS = {
    "causal_conv1d_fn": causal_conv1d_fn,
    "causal_conv1d_fn_triton": causal_conv1d_fn,
    "causal_conv1d_update": causal_conv1d_update,
    "causal_conv1d_update_triton": causal_conv1d_update,
    "mamba_chunk_scan_combined": mamba_chunk_scan_combined,
    "selective_state_update": selective_state_update,
}

_ABSENT = object()


@contextlib.contextmanager
def bound_globals(module: str, stand_ins: Dict[str, Any]) -> Iterator[None]:
    """``stand_ins`` as ``module``'s globals for the call (names the module did not have removed again)."""
    namespace = importlib.import_module(module).__dict__
    saved = {name: namespace.get(name, _ABSENT) for name in stand_ins}
    namespace.update(stand_ins)
    try:
        yield
    finally:
        for name, value in saved.items():
            if value is _ABSENT:
                namespace.pop(name, None)
            else:
                namespace[name] = value


def _bound():
    """The stand-ins as mamba.py's globals for the call (the names a CPU import leaves unbound removed again)."""
    return bound_globals(_MAMBA, _STAND_INS)


def _forward_around(original, self, *, hidden_states, output=None, layer_cache, metadata, mup_vector=None,
                    use_triton_causal_conv=False):
    if hidden_states.is_cuda:
        return original(self, hidden_states=hidden_states, output=output, layer_cache=layer_cache,
                        metadata=metadata, mup_vector=mup_vector, use_triton_causal_conv=use_triton_causal_conv)
    if metadata.has_mamba_track_mask:
        raise NotImplementedError("sglang-r3 CPU runtime: Mamba-2 state tracking for the radix cache "
                                  "(--mamba-radix-cache-strategy extra_buffer)")
    with _bound():
        return original(self, hidden_states=hidden_states, output=output, layer_cache=layer_cache,
                        metadata=metadata, mup_vector=mup_vector, use_triton_causal_conv=use_triton_causal_conv)


HOOKS = [(_FORWARD_TARGET, _forward_around)]
