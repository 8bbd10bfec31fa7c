"""Teach SGLang's ``torch_native`` attention backend the speculative forward modes.

Upstream ``TorchNativeAttnBackend`` only knows EXTEND and DECODE; on CPU the
EAGLE/MTP worker (``eagle_worker_v2``) additionally runs

* TARGET_VERIFY on the target model: ``q`` holds ``draft_token_num`` rows per
  request whose K/V were just written at ``out_cache_loc``; ``seq_lens`` is the
  committed prefix. Draft row j sees the prefix plus the draft rows its tree
  mask allows (for a topk=1 chain: rows 0..j, i.e. causal).
* DRAFT_EXTEND_V2 on the draft model: ordinary extend metadata
  (``extend_prefix_lens``/``extend_seq_lens``, post-write ``seq_lens``), which the
  stock extend path already handles once the verify slots are in
  ``req_to_token``; nothing to patch.
* multi-step draft DECODE (num_steps > 1): step i runs one query per candidate
  that must see the prefix plus its own i+1 draft slots. ``DraftBackendFactory``
  has no ``torch_native`` entry, so we add one that builds
  :class:`TorchNativeMultiStepDraftBackend` (modelled on
  ``IntelAMXMultiStepDraftBackend``), plus a plain ``TorchNativeAttnBackend`` for
  draft extend.
"""

from __future__ import annotations


import torch
from torch.nn.functional import scaled_dot_product_attention

from sglang_r3.cpu_runtime.ops import mla

_TORCH_NATIVE = "torch_native"


def _verify_forward(self, q, k, v, layer, forward_batch, save_kv_cache=True):
    from sglang.srt.mem_cache.memory_pool import KVWriteLoc

    cache_loc = forward_batch.out_cache_loc
    if save_kv_cache and k is not None and v is not None:
        self.token_to_kv_pool.set_kv_buffer(layer, KVWriteLoc(cache_loc, self.swa_out_cache_loc), k, v)

    spec_info = forward_batch.spec_info
    bs = forward_batch.batch_size
    q_ = q.reshape(-1, layer.tp_q_head_num, layer.qk_head_dim)
    n = q_.shape[0] // bs  # draft_token_num rows per request
    o = q_.new_empty((q_.shape[0], layer.tp_q_head_num, layer.v_head_dim))

    # A real tree (topk > 1) ships a QLEN_ONLY mask [bs, n, n] (the CPU
    # default, see eagle_utils.default_tree_mask_mode); a chain is causal.
    tree_mask = None
    if getattr(spec_info, "tree_topk", 1) != 1:
        custom = getattr(spec_info, "custom_mask", None)
        if custom is not None and custom.numel() == bs * n * n:
            tree_mask = custom.view(bs, n, n).to(torch.bool)
    chain = torch.ones((n, n), dtype=torch.bool, device=q.device).tril_()

    k_cache = self.token_to_kv_pool.get_key_buffer(layer.layer_id)
    v_cache = self.token_to_kv_pool.get_value_buffer(layer.layer_id)
    req_to_token = self.req_to_token_pool.req_to_token
    rows = forward_batch.req_pool_indices.tolist()
    prefix_lens = forward_batch.seq_lens.tolist()
    use_gqa = layer.tp_q_head_num != layer.tp_k_head_num
    window = _sliding_window(layer)
    for i, (row, prefix) in enumerate(zip(rows, prefix_lens)):
        # The draft slots are read through out_cache_loc rather than
        # req_to_token: verify does not rely on req_to_token covering them.
        kv_idx = torch.cat((req_to_token[row, :prefix].to(torch.int64), cache_loc[i * n : (i + 1) * n].to(torch.int64)))
        key = k_cache[kv_idx].movedim(0, 1)
        value = v_cache[kv_idx].movedim(0, 1)
        query = q_[i * n : (i + 1) * n].movedim(0, 1)
        if key.dtype != query.dtype:
            key, value = key.to(query.dtype), value.to(query.dtype)
        mask = torch.ones((n, prefix + n), dtype=torch.bool, device=q.device)
        mask[:, prefix:] = chain if tree_mask is None else tree_mask[i]
        if window is not None:
            # A sliding-window layer: as the stock extend/decode paths mask it (keys at most `window`
            # positions behind the query), by the draft rows' own positions.
            q_pos = forward_batch.positions[i * n : (i + 1) * n].to(torch.int64)
            k_pos = torch.cat((torch.arange(prefix, device=q.device), q_pos))
            mask &= k_pos.unsqueeze(0) >= q_pos.unsqueeze(1) - window
        out = scaled_dot_product_attention(
            query.unsqueeze(0),
            key.unsqueeze(0),
            value.unsqueeze(0),
            attn_mask=mask,
            scale=layer.scaling,
            enable_gqa=use_gqa,
        )
        o[i * n : (i + 1) * n] = out.squeeze(0).movedim(1, 0)
    return o.view(-1, layer.tp_q_head_num * layer.v_head_dim)


def _forward_extend_around(original, self, q, k, v, layer, forward_batch, save_kv_cache=True, **kwargs):
    if forward_batch.forward_mode.is_target_verify():
        return _verify_forward(self, q, k, v, layer, forward_batch, save_kv_cache)
    if mla.is_mha_over_latent_pool(self, k, v, forward_batch, save_kv_cache):
        return mla.mha_extend(self, q, k, v, layer, forward_batch)  # DeepSeek MLA prefill (mla.py)
    _fit_padded_requests(forward_batch)
    return original(self, q, k, v, layer, forward_batch, save_kv_cache, **kwargs)


def _fit_padded_requests(forward_batch) -> None:
    """DP-attention padding (``ForwardBatch._pad_inputs_to_size``) appends dummy requests whose draft-extend
    length is ``num_tokens_per_req`` but whose sequence length is the padded-row fill value (1); the stock
    per-request loop then slices a query longer than its sequence. Dummy rows are discarded after the
    forward: giving them a sequence as long as their extend changes no real request's attention."""
    real = getattr(forward_batch, "_original_batch_size", None)
    seq_lens, ext, pre = forward_batch.seq_lens, forward_batch.extend_seq_lens, forward_batch.extend_prefix_lens
    if real is None or ext is None or pre is None or seq_lens.shape[0] <= real:
        return
    need = pre[real:] + ext[real:]
    seq_lens[real:] = torch.maximum(seq_lens[real:], need.to(seq_lens.dtype))


def _forward_decode_around(original, self, q, k, v, layer, forward_batch, save_kv_cache=True, **kwargs):
    meta = getattr(self, "draft_decode_metadata", None)
    if meta is None:
        return original(self, q, k, v, layer, forward_batch, save_kv_cache, **kwargs)
    # Multi-step draft decode: same as decode, but over the expanded
    # per-candidate req_to_token rows/lengths the multi-step backend built.
    from sglang.srt.mem_cache.memory_pool import KVWriteLoc

    req_to_token, seq_lens, req_pool_indices = meta
    q = q.reshape(-1, layer.tp_q_head_num * layer.qk_head_dim)
    o = q.new_empty((q.shape[0], layer.tp_q_head_num * layer.v_head_dim))
    if save_kv_cache and k is not None and v is not None:
        self.token_to_kv_pool.set_kv_buffer(
            layer, KVWriteLoc(forward_batch.out_cache_loc, self.swa_out_cache_loc), k, v
        )
    self._run_sdpa_forward_decode(
        q.view(-1, layer.tp_q_head_num, layer.qk_head_dim),
        o.view(-1, layer.tp_q_head_num, layer.v_head_dim),
        self.token_to_kv_pool.get_key_buffer(layer.layer_id),
        self.token_to_kv_pool.get_value_buffer(layer.layer_id),
        req_to_token,
        req_pool_indices,
        seq_lens,
        None,
        scaling=layer.scaling,
        enable_gqa=layer.tp_q_head_num != layer.tp_k_head_num,
        causal=False,
        sliding_window_size=_sliding_window(layer),
    )
    return o


def _sliding_window(layer):
    """The layer's sliding window, as the stock torch_native paths take it (None: full attention)."""
    size = getattr(layer, "sliding_window_size", None)
    if size is None or size <= -1 or getattr(layer, "is_cross_attention", False):
        return None
    return size


class TorchNativeMultiStepDraftBackend:
    """One ``TorchNativeAttnBackend`` per draft step (num_steps - 1 of them)."""

    def __init__(self, model_runner, topk: int, speculative_num_steps: int):
        from sglang.srt.layers.attention.torch_native_backend import TorchNativeAttnBackend

        self.topk = topk
        self.speculative_num_steps = speculative_num_steps
        self.device = model_runner.device
        self.pool_len = model_runner.req_to_token_pool.req_to_token.shape[1]
        self.attn_backends = [TorchNativeAttnBackend(model_runner) for _ in range(speculative_num_steps - 1)]
        for backend in self.attn_backends:
            backend.draft_decode_metadata = None

    def init_forward_metadata(self, forward_batch):
        # The op spec_ops registers (sglang-kernel 0.4.4, SGLang 0.5.15's, has no Python wrapper for it).
        build_draft_decode_metadata_cpu = torch.ops.sgl_kernel.build_draft_decode_metadata_cpu

        topk = self.topk
        backend0 = self.attn_backends[0]
        req_to_token = backend0.req_to_token_pool.req_to_token
        seq_lens = forward_batch.seq_lens
        req_to_token_draft = build_draft_decode_metadata_cpu(
            req_to_token, forward_batch.req_pool_indices, seq_lens, topk, self.speculative_num_steps, self.pool_len
        )
        rows = torch.arange(seq_lens.numel() * topk, dtype=torch.int64, device=self.device)
        for step, backend in enumerate(self.attn_backends):
            backend.init_forward_metadata(forward_batch)
            # Each candidate sees the prefix plus its first step + 1 draft slots.
            backend.draft_decode_metadata = (
                req_to_token_draft,
                seq_lens.repeat_interleave(topk) + step + 1,
                rows,
            )


def _create_backend_around(original, self, backend_name, backend_map, error_template, *args, **kwargs):
    # DraftBackendFactory builds its backend maps as literals inside create_decode_backend /
    # create_draft_extend_backend; both funnel through _create_backend, where we add the torch_native entry.
    # 0.5.23: stamps_children is True exactly for the multi-step decode container, and a map entry returns
    # (stamp, backend). 0.5.15: no stamps_children (the decode container is the one create_decode_backend asks
    # for, named by its error template), and a map entry returns the backend itself.
    from sglang_r3.seam.release import draft_backends_are_stamped

    if draft_backends_are_stamped():
        decode_container = bool(args[0] if args else kwargs.get("stamps_children", False))
        wrap = lambda backend: (_TORCH_NATIVE, backend)  # noqa: E731
    else:
        decode_container = error_template.startswith("EAGLE is not supported in decode attention backend")
        wrap = lambda backend: backend  # noqa: E731
    if _TORCH_NATIVE not in backend_map:
        backend_map = dict(backend_map)
        if decode_container:
            backend_map[_TORCH_NATIVE] = lambda: wrap(
                TorchNativeMultiStepDraftBackend(self.draft_model_runner, self.topk, self.speculative_num_steps))
        else:

            def _extend_backend():
                from sglang.srt.layers.attention.torch_native_backend import TorchNativeAttnBackend

                return wrap(TorchNativeAttnBackend(self.draft_model_runner))

            backend_map[_TORCH_NATIVE] = _extend_backend
    return original(self, backend_name, backend_map, error_template, *args, **kwargs)


HOOKS = [
    ("sglang.srt.layers.attention.torch_native_backend.TorchNativeAttnBackend.forward_extend", _forward_extend_around),
    ("sglang.srt.layers.attention.torch_native_backend.TorchNativeAttnBackend.forward_decode", _forward_decode_around),
    ("sglang.srt.speculative.draft_utils.DraftBackendFactory._create_backend", _create_backend_around),
]
