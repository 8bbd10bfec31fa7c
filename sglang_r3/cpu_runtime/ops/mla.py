"""DeepSeek MLA on the torch_native backend: the MHA prefill over an MLA latent pool.

SGLang 0.5.23 has no MLA dispatch entry for ``torch_native``, so DeepSeek attention takes the
triton handler (``deepseek_common/attention_backend_handler.py``): a prefill without cached prefix
runs ``forward_normal`` (MHA). It writes the compressed latent ``[kv_lora_rank + qk_rope_head_dim]``
to the KV pool itself and calls ``attn_mha(q, k, v, save_kv_cache=False)`` with the decompressed
per-head ``k`` (``qk_nope + qk_rope``) and ``v`` (``v_head_dim``): the attention must run over those.
``TorchNativeAttnBackend.forward_extend`` ignores the passed ``k``/``v`` and reads keys and values
from the pool instead, i.e. the latent. With ``kv_lora_rank != qk_nope_head_dim`` the shapes clash
(SDPA error); with them equal it runs and attends over the latent as if it were keys and values, so
every later layer (and every routed row) is of another forward than transformers'.

Decode, extends over a cached prefix and the speculative modes take the absorbed MLA path
(``attn_mqa`` over the latent), which the stock backend reads correctly from the pool.
"""

from __future__ import annotations

from torch.nn.functional import scaled_dot_product_attention


def is_mha_over_latent_pool(backend, k, v, forward_batch, save_kv_cache: bool) -> bool:
    """The forward_normal call: decompressed k/v handed in, nothing to write, an MLA latent pool."""
    pool = backend.token_to_kv_pool
    return (
        not save_kv_cache
        and k is not None
        and v is not None
        and getattr(pool, "kv_lora_rank", None) is not None
        and forward_batch.forward_mode.is_extend()
        and not forward_batch.forward_mode.is_target_verify()
    )


def mha_extend(backend, q, k, v, layer, forward_batch):
    """Causal attention of each sequence's new tokens over their own k/v (no cached prefix)."""
    prefix = forward_batch.extend_prefix_lens_cpu
    if prefix is None:
        prefix = forward_batch.extend_prefix_lens.tolist()
    if any(int(p) for p in prefix):
        # forward_normal over a cached prefix would need the prefix's decompressed k/v, which the
        # latent pool does not hold; SGLang's triton handler never picks MHA then.
        raise NotImplementedError(
            "sglang-r3 CPU runtime: MHA attention over an MLA latent pool with a cached prefix "
            f"(extend_prefix_lens={list(prefix)}) is not implemented"
        )
    lens = forward_batch.extend_seq_lens_cpu
    if lens is None:
        lens = forward_batch.extend_seq_lens.tolist()
    heads = layer.tp_q_head_num
    q_ = q.reshape(-1, heads, layer.qk_head_dim)
    k_ = k.reshape(-1, layer.tp_k_head_num, layer.qk_head_dim)
    v_ = v.reshape(-1, layer.tp_v_head_num, layer.v_head_dim)
    o = q_.new_empty((q_.shape[0], heads, layer.v_head_dim))
    start = 0
    for n in (int(x) for x in lens):
        end = start + n
        out = scaled_dot_product_attention(
            q_[start:end].movedim(0, 1).unsqueeze(0),
            k_[start:end].movedim(0, 1).unsqueeze(0).to(q_.dtype),
            v_[start:end].movedim(0, 1).unsqueeze(0).to(q_.dtype),
            is_causal=True,
            scale=layer.scaling,
            enable_gqa=heads != layer.tp_k_head_num,
        )
        o[start:end] = out.squeeze(0).movedim(1, 0)
        start = end
    return o.view(-1, heads * layer.v_head_dim)
