"""Drives SGLang 0.5.23's own accepted-token KV move (EAGLE tree drafting, topk > 1) on CPU tensors.

Run as a separate process (it switches SGLang into its CPU mode): prints a JSON verdict.
Only the ScheduleBatch is a stand-in (the two fields the function reads); the KV pool,
the move function, its index kernels and our capturer are the real ones.
"""

import json
import types

if __name__ == "__main__":
    from sglang_r3.dev.cpu import activate_cpu_runtime

    activate_cpu_runtime()
    from sglang_r3.cpu_runtime import install_cpu_patches

    install_cpu_patches()

    import torch
    from sglang.srt.mem_cache.memory_pool import MHATokenToKVPool
    from sglang.srt.speculative.spec_utils import move_accept_tokens_to_target_kvcache

    from sglang_r3.serving.capture import RoutingCapturer
    from sglang_r3.dev.embedded import ensure_embedded_model
    from sglang_r3.core.layout import layout_from_model_path
    from sglang_r3.serving.adapter.capture_site import _follow_kv_moves

    layout = layout_from_model_path(str(ensure_embedded_model()))
    pool = MHATokenToKVPool(
        size=256, page_size=1, dtype=torch.float32, head_num=2, head_dim=4, layer_num=2,
        device="cpu", enable_memory_saver=False, enable_alt_stream=False, enable_kv_cache_copy=True,
    )
    cap = RoutingCapturer(layout, num_slots=260, max_batch_tokens=64)
    _follow_kv_moves(cap, pool)

    # Two requests, 6 tree tokens each (topk 2): verify wrote KV and rows at these slots.
    num_draft = 6
    out_cache_loc = torch.arange(100, 100 + 2 * num_draft, dtype=torch.int64)
    g = torch.Generator().manual_seed(0)
    for s in out_cache_loc.tolist():
        cap.host[s] = torch.stack([torch.randperm(16, generator=g)[: layout.topk] for _ in layout.moe_layer_ids]).to(cap.dtype)
        for kb in pool.k_buffer:
            kb[s] = float(s)
    # Accepted path per request (indices into the flattened tree), -1 padded: req0 takes tree nodes
    # 0 -> 2 -> 5, req1 takes 6 -> 9 (one correct draft).
    accept_index = torch.tensor([[0, 2, 5], [6, 9, -1]], dtype=torch.int32)
    num_correct = torch.tensor([2, 1], dtype=torch.int32)
    before = cap.host.clone()
    batch = types.SimpleNamespace(seq_lens=torch.tensor([20, 30]), out_cache_loc=out_cache_loc)
    move_accept_tokens_to_target_kvcache(batch, accept_index, num_correct, types.SimpleNamespace(get_kvcache=lambda: pool))

    expected = {}  # target slot -> source slot: accepted nodes move to the front of each request's window
    for r, (acc, n) in enumerate(zip(accept_index.tolist(), num_correct.tolist())):
        for j, node in enumerate(acc[: n + 1]):
            expected[100 + r * num_draft + j] = 100 + node
    ok_rows = all(torch.equal(cap.host[t], before[s]) for t, s in expected.items())
    ok_kv = all(float(pool.k_buffer[0][t].flatten()[0]) == float(s) for t, s in expected.items())
    moved = [(t, s) for t, s in expected.items() if t != s]
    print(json.dumps({"rows_follow_kv": ok_rows, "kv_moved": ok_kv, "moves": moved, "rows_moved": cap.stats.rows_moved}))
