"""``python -m benchmarks.gpu_check``: the GPU-path properties CPU tests can only pin by structure, on CUDA.

Runs on a bare GPU host with torch, numpy and msgpack (plus the small wheels pybase64 -- which
sglang_r3.serving.capture's transport imports -- and megatron-core for the replay check); it imports no
SGLang. One line per check (``PASS``/``FAIL name: what was seen``), exit status 1 if any failed,
about a minute on one GPU. On a machine without CUDA it says so and exits 0, claiming nothing.

1. ``routing_capturer_cuda_graph``: ``RoutingCapturer`` (CUDA staging, pinned host rows) with every
   MoE router's top-k captured into a CUDA graph; replays with new inputs give the rows an eager
   run of the same inputs gives; the staging storage never changes.
2. ``draft_capturer_cuda_graph``: the same for ``DraftCapturer`` (draft routers inside a graph,
   filed once per draft forward after replay).
2b. ``dp_window_cuda_graph``: DP attention's gathered batch (two ranks, a decode graph's layout): rank 1's
   window (``adapter/dp_rows.dp_window``) captured inside a CUDA graph; replays give the rows of rank 1's
   own tokens routed alone. (DeepEP's attention-TP all-gather needs several GPUs: not checked here.)
3. ``deferred_copy_side_stream``: ``on_forward_end(no_copy_to_cpu=True)`` under
   ``torch.cuda.set_sync_debug_mode("error")`` (any blocking copy or sync in the forward raises),
   then the copy on a side stream gated by an event, as SGLang's overlap scheduler makes it
   (``copy_stream.wait_stream(forward)``, pinned non-blocking D2H per tensor, ``copy_done`` event,
   ``finalize`` after it): host rows and marks equal the synchronous path's.
4. ``pinned_host_rows``: the capturer's host rows and marks are pinned; deferred copies land in pinned memory.
5. ``replay_filler_megatron_cuda``: ``ReplayFiller(..., measure=True)`` replaying into a real
   megatron-core MoE+MTP GPTModel on CUDA: the routers use the records (forward hooks), records
   equal to the model's own routing count 0 flips, flips planted in the last MoE layer count
   exactly, and inside every router's call (hooks included) ``set_sync_debug_mode("warn")`` reports
   no synchronizing CUDA call with measuring on.

``--cpu-selftest`` runs the checks' logic on CPU tensors where it can (CUDA-only steps skipped);
it proves nothing about a GPU and exists so the script itself is tested where no GPU is.
"""

from __future__ import annotations

import argparse
import os
import socket
import sys
import time
import traceback
import types
import warnings
from contextlib import contextmanager
from typing import Callable, Dict, List, Optional, Tuple

import numpy as np
import torch

NEEDS_CUDA = "gpu_check needs CUDA (torch.cuda.is_available() is False here); nothing was checked"

E, K = 16, 4  # experts, top-k of the check's layout (the embedded model's)
MAX_TOKENS = 256
SLOTS = 4096


class CheckFailed(AssertionError):
    pass


def _require(ok: bool, what: str) -> None:
    if not ok:
        raise CheckFailed(what)


def _layout():
    from sglang_r3.core.layout import LayerInfo, ModelLayout

    return ModelLayout("Glm4MoeForCausalLM", 4, (
        LayerInfo(0, "dense"), *(LayerInfo(i, "moe", None, E, K) for i in (1, 2, 3)), LayerInfo(4, "mtp", 1, E, K)))


def _batch(slots: torch.Tensor):
    return types.SimpleNamespace(out_cache_loc=slots, out_cache_loc_virtual=None)


@contextmanager
def _sync_mode(device: torch.device, mode: str):
    """torch.cuda.set_sync_debug_mode for the block (nothing on CPU)."""
    if device.type != "cuda":
        yield
        return
    prev = torch.cuda.get_sync_debug_mode()
    torch.cuda.set_sync_debug_mode(mode)
    try:
        yield
    finally:
        torch.cuda.set_sync_debug_mode(prev)


def _routers_forward(weights: List[torch.Tensor], x: torch.Tensor, capture: Callable[[int, torch.Tensor], None]):
    """A stand-in MoE stack: each layer's router scores x and captures its top-k (device ops only)."""
    for layer, w in zip((1, 2, 3), weights):
        ids = torch.topk(x @ w, K, dim=1).indices.to(torch.int32)
        capture(layer, ids)
        x = x + 0.1 * torch.tanh(x @ w @ w.t())


def check_routing_capturer_cuda_graph(device: torch.device) -> str:
    from sglang_r3.serving.capture.capturer import RoutingCapturer

    if device.type != "cuda":
        return "skip (CUDA graphs need CUDA)"
    g = torch.Generator(device="cpu").manual_seed(0)
    weights = [torch.randn(64, E, generator=g).to(device) for _ in range(3)]
    n = 48
    graphed = RoutingCapturer(_layout(), SLOTS, MAX_TOKENS, device=device)
    eager = RoutingCapturer(_layout(), SLOTS, MAX_TOKENS, device=device)
    ptr = graphed.staging_ptr()
    static_x = torch.zeros(n, 64, device=device)
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):  # warm-up off the default stream, as torch.cuda.graph asks
        for _ in range(2):
            _routers_forward(weights, static_x, graphed.capture)
            graphed.on_forward_end(_batch(torch.arange(SLOTS - n, SLOTS, device=device)))
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        _routers_forward(weights, static_x, graphed.capture)
    # The recording forward's end (its rows go to scratch slots, never compared).
    graphed.on_forward_end(_batch(torch.arange(SLOTS - n, SLOTS, device=device)))
    for step in range(4):
        x = torch.randn(n, 64, generator=g).to(device)
        slots = torch.arange(step * n, (step + 1) * n, device=device)
        static_x.copy_(x)
        graph.replay()
        graphed.on_forward_end(_batch(slots), can_run_graph=True)
        _routers_forward(weights, x, eager.capture)
        eager.on_forward_end(_batch(slots))
        _require(graphed.staging_ptr() == ptr, f"replay {step}: staging storage changed")
    torch.cuda.synchronize()
    used = torch.arange(4 * n)
    rows_g, missing_g = graphed.rows_for_slots(used)
    rows_e, missing_e = eager.rows_for_slots(used)
    _require(missing_g == missing_e == 0, f"missing rows: graphed {missing_g}, eager {missing_e}")
    _require(torch.equal(rows_g, rows_e), "graph-replayed rows differ from the eager run's")
    return f"4 replays x {n} tokens x 3 MoE layers equal the eager rows; staging storage unchanged"


def check_dp_window_cuda_graph(device: torch.device) -> str:
    """DP attention: the routers route two ranks' tokens gathered; rank 1 captures its window, inside a graph."""
    from sglang_r3.serving.capture.capturer import RoutingCapturer
    from sglang_r3.serving.adapter.dp_rows import dp_window

    n = 24  # tokens per rank, as a decode graph of 24 records them (MAX_LEN: every rank at the graph's size)

    def rank1(layer, ids):
        return graphed_or_eager[0].capture(layer, dp_window(ids, [n, n], 1, 2 * n))

    g = torch.Generator(device="cpu").manual_seed(1)
    weights = [torch.randn(64, E, generator=g).to(device) for _ in range(3)]
    graphed = RoutingCapturer(_layout(), SLOTS, MAX_TOKENS, device=device)
    eager = RoutingCapturer(_layout(), SLOTS, MAX_TOKENS, device=device)
    static_x = torch.zeros(2 * n, 64, device=device)
    graph = None
    graphed_or_eager = [graphed]
    if device.type == "cuda":
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            for _ in range(2):
                _routers_forward(weights, static_x, rank1)
                graphed.on_forward_end(_batch(torch.arange(SLOTS - n, SLOTS, device=device)))
        torch.cuda.current_stream().wait_stream(side)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            _routers_forward(weights, static_x, rank1)
        graphed.on_forward_end(_batch(torch.arange(SLOTS - n, SLOTS, device=device)))
    for step in range(4):
        x = torch.randn(2 * n, 64, generator=g).to(device)
        slots = torch.arange(step * n, (step + 1) * n, device=device)
        graphed_or_eager[0] = graphed
        static_x.copy_(x)
        if graph is not None:
            graph.replay()
        else:
            _routers_forward(weights, static_x, rank1)
        graphed.on_forward_end(_batch(slots), can_run_graph=graph is not None)
        # The oracle: rank 1's own tokens routed alone (a row is a function of its token).
        _routers_forward(weights, x[n:], eager.capture)
        eager.on_forward_end(_batch(slots))
    if device.type == "cuda":
        torch.cuda.synchronize()
    used = torch.arange(4 * n)
    rows_g, missing_g = graphed.rows_for_slots(used)
    rows_e, missing_e = eager.rows_for_slots(used)
    _require(missing_g == missing_e == 0, f"missing rows: windowed {missing_g}, own batch {missing_e}")
    _require(torch.equal(rows_g, rows_e), "rank 1's window of the gathered batch differs from its own tokens' rows")
    how = "4 graph replays" if graph is not None else "4 eager forwards (CPU self-test)"
    return f"{how}: rank 1's window of a 2 x {n}-token gathered batch equals its own tokens' rows"


def check_draft_capturer_cuda_graph(device: torch.device) -> str:
    from sglang_r3.serving.capture.draft import DraftCapturer

    if device.type != "cuda":
        return "skip (CUDA graphs need CUDA)"
    cfg = object()
    n = 8
    g = torch.Generator(device="cpu").manual_seed(1)
    w = torch.randn(64, E, generator=g).to(device)
    graphed = DraftCapturer({id(cfg): 1}, K, torch.uint8, max_tokens=MAX_TOKENS, device=device, per_request=True)
    eager = DraftCapturer({id(cfg): 1}, K, torch.uint8, max_tokens=MAX_TOKENS, device=device, per_request=True)
    for d in (graphed, eager):
        d.set_wanted(0, True)
        d.set_wanted(1, True)
    ptr = graphed.staging.untyped_storage().data_ptr()
    static_x = torch.zeros(n, 64, device=device)

    def draft_forward(dc, x):
        dc.capture(cfg, torch.topk(x @ w, K, dim=1).indices.to(torch.int32))

    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        draft_forward(graphed, static_x)
    torch.cuda.current_stream().wait_stream(side)
    graphed.drop_staged()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        draft_forward(graphed, static_x)
    graphed.drop_staged()  # the recording forward is filed for nobody
    positions = torch.arange(10, 10 + n, device=device)
    tokens = torch.arange(100, 100 + n, device=device)
    for step in range(3):
        x = torch.randn(n, 64, generator=g).to(device)
        static_x.copy_(x)
        graph.replay()
        graphed.file_forward([0, 1], [n // 2, n // 2], [n // 2, n // 2], positions, tokens, step=0, graph_replay=True)
        draft_forward(eager, x)
        eager.file_forward([0, 1], [n // 2, n // 2], [n // 2, n // 2], positions, tokens, step=0)
        _require(graphed.staging.untyped_storage().data_ptr() == ptr, "draft staging storage changed")
    for req in (0, 1):
        a, b = graphed.collect(req, seqlen=1000), eager.collect(req, seqlen=1000)
        _require(a is not None and b is not None, f"request {req}: no draft entries filed")
        _require(np.array_equal(a.experts, b.experts) and np.array_equal(a.positions, b.positions),
                 f"request {req}: graph-replayed draft entries differ from the eager run's")
    return "3 replayed draft forwards filed per request equal the eager entries; staging storage unchanged"


def _d2h(t: torch.Tensor) -> torch.Tensor:
    """What SGLang's overlap path does per tensor (sglang/srt/utils/common.py async_d2h, 0.5.23)."""
    if t.device.type == "cpu":
        return t
    host = torch.empty(t.shape, dtype=t.dtype, pin_memory=True)
    host.copy_(t, non_blocking=True)
    t.record_stream(torch.cuda.current_stream())
    return host


def check_deferred_copy_side_stream(device: torch.device) -> str:
    from sglang_r3.serving.capture.capturer import RoutingCapturer

    sync = RoutingCapturer(_layout(), SLOTS, MAX_TOKENS, device=device)
    deferred = RoutingCapturer(_layout(), SLOTS, MAX_TOKENS, device=device)
    g = torch.Generator(device="cpu").manual_seed(2)
    weights = [torch.randn(64, E, generator=g).to(device) for _ in range(3)]
    copy_stream = torch.cuda.Stream() if device.type == "cuda" else None
    pending: List[Tuple[object, object]] = []
    landed_pinned = True
    sizes = (1, 7, 64, 200)
    off = 0
    for n in sizes:
        x = torch.randn(n, 64, generator=g).to(device)
        slots = torch.randperm(SLOTS, generator=g)[:n].to(device) if n > 1 else torch.tensor([off], device=device)
        off += n
        _routers_forward(weights, x, sync.capture)
        sync.on_forward_end(_batch(slots))
        with _sync_mode(device, "error"):  # a blocking copy or any sync in the forward raises here
            _routers_forward(weights, x, deferred.capture)
            holder = deferred.on_forward_end(_batch(slots), no_copy_to_cpu=True)
        _require(holder is not None, "no deferred holder returned")
        if copy_stream is not None:
            copy_stream.wait_stream(torch.cuda.current_stream())
            with torch.cuda.stream(copy_stream):
                holder.map_device_tensors(_d2h)
                done = torch.cuda.Event()
                done.record()
            landed_pinned &= bool(holder.rows is None or holder.rows.is_pinned())
        else:
            holder.map_device_tensors(lambda t: t)
            done = None
        pending.append((holder, done))
    _require(not bool(deferred.written.any()), "rows reached the host before finalize")
    for holder, done in pending:
        if done is not None:
            done.synchronize()
        holder.finalize()
    _require(torch.equal(sync.host, deferred.host), "deferred host rows differ from the synchronous path's")
    _require(torch.equal(sync.written, deferred.written), "deferred written marks differ from the synchronous path's")
    _require(deferred.stats.blocking_copies == 0, f"{deferred.stats.blocking_copies} blocking copies counted")
    _require(landed_pinned, "a deferred copy landed in pageable memory")
    where = "side stream + event, sync debug mode 'error' around each forward" if copy_stream is not None else "CPU"
    return f"{len(sizes)} forwards ({'/'.join(map(str, sizes))} tokens): rows equal the synchronous path; 0 blocking copies ({where})"


def check_pinned_host_rows(device: torch.device) -> str:
    from sglang_r3.serving.capture.capturer import RoutingCapturer

    if device.type != "cuda":
        return "skip (pinned memory needs CUDA)"
    cap = RoutingCapturer(_layout(), SLOTS, MAX_TOKENS, device=device)
    _require(cap.host.is_pinned() and cap.written.is_pinned(), "host rows or marks are not pinned")
    _require(cap.staging.is_cuda, "staging is not on the device")
    return f"host rows {tuple(cap.host.shape)} and marks pinned; staging on {cap.staging.device}"


# -- ReplayFiller into megatron-core routers ------------------------------------------------------


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _init_megatron(device: torch.device) -> None:
    import torch.distributed as dist

    if not dist.is_initialized():  # one rank of its own: never a port inherited from a parent process
        os.environ["MASTER_ADDR"] = "127.0.0.1"
        os.environ["MASTER_PORT"] = str(_free_port())
    if device.type == "cpu":  # self-test only: the CPU shims the CPU tests use
        sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "tests", "trainer"))
        from megatron_cpu import init_megatron_cpu

        init_megatron_cpu()
        return
    from megatron.core import parallel_state
    from megatron.core.tensor_parallel.random import model_parallel_cuda_manual_seed
    from megatron.core.transformer.moe import moe_utils

    # megatron-core 0.16.1's moe_utils binds te_general_gemm only when Transformer Engine imports,
    # yet its router gemm reads the name unconditionally (NameError on a TE-less CUDA host, seen on
    # an H200 2026-12-04). None is the value its own check treats as "no TE": the torch matmul path.
    if not getattr(moe_utils, "HAVE_TE", True) and not hasattr(moe_utils, "te_general_gemm"):
        moe_utils.te_general_gemm = None

    if not dist.is_initialized():
        dist.init_process_group("nccl", rank=0, world_size=1)
    if not parallel_state.model_parallel_is_initialized():
        parallel_state.initialize_model_parallel(1, 1)
    model_parallel_cuda_manual_seed(1234)


def _build_gpt(device: torch.device):
    """A megatron-core GLM-style MoE GPTModel with one MTP layer (as tests/trainer/megatron_cpu.py builds it)."""
    from megatron.core.models.gpt import GPTModel
    from megatron.core.models.gpt.gpt_layer_specs import get_gpt_decoder_block_spec, get_gpt_mtp_block_spec
    from megatron.core.transformer import TransformerConfig

    torch.manual_seed(1234)
    config = TransformerConfig(
        num_layers=4, hidden_size=64, num_attention_heads=4, ffn_hidden_size=128, moe_ffn_hidden_size=32,
        num_moe_experts=E, moe_router_topk=K, moe_layer_freq=[0, 1, 1, 1], moe_token_dispatcher_type="allgather",
        moe_router_load_balancing_type="aux_loss", moe_aux_loss_coeff=1e-3, moe_enable_routing_replay=True,
        mtp_num_layers=1, mtp_loss_scaling_factor=0.1, use_cpu_initialization=True, bf16=False,
        params_dtype=torch.float32, hidden_dropout=0.0, attention_dropout=0.0, add_bias_linear=False,
        gated_linear_unit=True,
    )
    block = get_gpt_decoder_block_spec(config, use_transformer_engine=False, normalization="RMSNorm")
    mtp = get_gpt_mtp_block_spec(config, block, use_transformer_engine=False)
    model = GPTModel(config=config, transformer_layer_spec=block, vocab_size=128, max_sequence_length=256,
                     position_embedding_type="rope", mtp_block_spec=mtp)
    return model.to(device)


def _forward(model, tokens: List[torch.Tensor], device: torch.device, train: bool):
    """Samples packed into one sequence, each attending to itself only (positions from 0 per sample)."""
    model.train(train)
    ids = torch.cat(tokens).reshape(1, -1).to(device)
    S = ids.shape[1]
    sample = torch.repeat_interleave(torch.arange(len(tokens)), torch.tensor([len(t) for t in tokens]))
    mask = torch.triu(torch.ones(S, S, dtype=torch.bool), diagonal=1) | (sample[:, None] != sample[None, :])
    pos = torch.cat([torch.arange(len(t)) for t in tokens]).reshape(1, S)
    return model(ids, pos.to(device), mask[None, None].to(device), labels=torch.roll(ids, -1, dims=1))


class _RouterSyncGuard:
    """Every router's call (its hooks included: the filler's row guard, the meters) runs under
    ``set_sync_debug_mode("warn")``; the synchronizing CUDA calls made there are counted from the
    warnings torch emits for each (Megatron's own router code included, so a count above 0 says
    where to look rather than stopping at the first)."""

    def __init__(self, routers, device: torch.device):
        self.on = device.type == "cuda"
        self._prev: List[int] = []
        self.calls = 0
        self.syncs: List[str] = []
        self._caught = None
        self._ctx = warnings.catch_warnings(record=True)
        self._handles = [h for r in routers for h in (
            r.register_forward_pre_hook(self._enter, prepend=True), r.register_forward_hook(self._leave))]

    def __enter__(self):
        self._caught = self._ctx.__enter__()
        warnings.simplefilter("always")
        return self

    def __exit__(self, *exc):
        self.close()
        self._ctx.__exit__(*exc)
        self.syncs = [str(w.message) for w in self._caught if "synchroniz" in str(w.message).lower()]
        return False

    def _enter(self, module, args):
        self.calls += 1
        if self.on:
            self._prev.append(torch.cuda.get_sync_debug_mode())
            torch.cuda.set_sync_debug_mode("warn")

    def _leave(self, module, args, output):
        if self.on:
            torch.cuda.set_sync_debug_mode(self._prev.pop())

    def close(self):
        if self.on and self._prev:
            torch.cuda.set_sync_debug_mode(self._prev[0])
            self._prev = []
        for h in self._handles:
            h.remove()
        self._handles = []


def check_replay_filler_megatron_cuda(device: torch.device) -> str:
    from megatron.core.transformer.moe.router import TopKRouter

    from sglang_r3.core.record import RoutingRecord, token_digest
    from sglang_r3.trainer import ReplayFiller

    _init_megatron(device)
    model = _build_gpt(device)
    layout = _layout()
    lengths = [33, 57, 18]
    g = torch.Generator().manual_seed(3)
    tokens = [torch.randint(0, 128, (n,), generator=g) for n in lengths]
    filler = ReplayFiller(model, layout, measure=True)

    chosen: Dict[str, List[torch.Tensor]] = {}

    def spy(name):
        def hook(module, args, output):
            # Device ops only (this hook runs inside the router's call): routing_map [S, E] -> sorted ids.
            chosen.setdefault(name, []).append(
                torch.sort(torch.topk(output[1].to(torch.int8), K, dim=1).indices, dim=1).values.detach())
        return hook

    names = {id(m): n for n, m in model.named_modules() if isinstance(m, TopKRouter)}
    spies = [m.register_forward_hook(spy(n)) for n, m in model.named_modules() if isinstance(m, TopKRouter)]
    try:
        filler.clear()
        with torch.no_grad():
            _forward(model, tokens, device, train=False)
        own = {s.layer_id: chosen[names[id(s.router)]][-1].cpu().numpy() for s in filler.decoder_sites}

        def records(rows_by_layer):
            out, off = [], 0
            for t in tokens:
                n = len(t) - 1
                e = np.stack([rows_by_layer[l][off:off + n] for l in layout.moe_layer_ids], axis=1).astype(np.uint8)
                out.append(RoutingRecord(layout.fingerprint, 0, layout.moe_layer_ids, e, tokens_digest=token_digest(t)))
                off += len(t)
            return out

        planted = [3, 40, 41, 95]  # record rows (not pad rows) of layer 3 given another expert set
        changed = dict(own)
        changed[3] = own[3].copy()
        for r in planted:
            changed[3][r, 0] = next(e for e in range(E) if e not in set(changed[3][r].tolist()))
        results = []
        for name, rows in (("own routing", own), ("4 flips planted in layer 3", changed)):
            recs = records(rows)
            filler.fill(recs, tokens)
            chosen.clear()
            with _RouterSyncGuard([s.router for s in filler.sites], device) as guard:
                loss = _forward(model, tokens, device, train=True)
                filler.replay_backward()
                loss.mean().backward()
            _require(guard.calls == len(filler.sites), f"{name}: {guard.calls} router calls, expected {len(filler.sites)}")
            _require(not guard.syncs, f"{name}: {len(guard.syncs)} synchronizing CUDA call(s) inside routers "
                                      f"with measure on, first: {guard.syncs[:1]}")
            model.zero_grad(set_to_none=True)
            filler.clear()
            h = filler.health()
            for s in filler.decoder_sites:  # the routers used the records
                got = chosen[names[id(s.router)]][0].cpu().numpy()
                want = np.sort(np.concatenate([np.concatenate([r.experts[:, layout.moe_layer_ids.index(s.layer_id)],
                                                               np.zeros((1, K), np.uint8)]) for r in recs]), axis=1)
                real = np.concatenate([np.r_[np.ones(len(t) - 1, bool), False] for t in tokens])
                _require(np.array_equal(got[real], want[real]), f"{name}: layer {s.layer_id} did not replay the records")
            expect = 0 if name == "own routing" else len(planted)
            _require(h["r3/pairs_flipped"] == expect and h["r3/tokens_flipped"] == expect,
                     f"{name}: health counted {h['r3/pairs_flipped']} flipped pairs, "
                     f"{h['r3/tokens_flipped']} tokens, expected {expect}")
            _require(h["r3/rows_replayed"] == sum(lengths) - len(lengths), f"{name}: rows_replayed {h['r3/rows_replayed']}")
            results.append(f"{name}: {int(h['r3/pairs_flipped'])} flips")
    finally:
        for s in spies:
            s.remove()
    where = "0 synchronizing CUDA calls inside the routers' calls" if device.type == "cuda" else "CPU self-test"
    return f"{'; '.join(results)} over {sum(lengths) - len(lengths)} rows x 3 layers, forward+backward ({where})"


CHECKS = (
    ("routing_capturer_cuda_graph", check_routing_capturer_cuda_graph),
    ("draft_capturer_cuda_graph", check_draft_capturer_cuda_graph),
    ("dp_window_cuda_graph", check_dp_window_cuda_graph),
    ("deferred_copy_side_stream", check_deferred_copy_side_stream),
    ("pinned_host_rows", check_pinned_host_rows),
    ("replay_filler_megatron_cuda", check_replay_filler_megatron_cuda),
)


def main(argv: Optional[List[str]] = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--cpu-selftest", action="store_true", help="run the checks' logic on CPU (proves nothing about a GPU)")
    args = ap.parse_args(argv)
    if not args.cpu_selftest and not torch.cuda.is_available():
        print(NEEDS_CUDA)
        return 0
    device = torch.device("cuda", torch.cuda.current_device()) if not args.cpu_selftest else torch.device("cpu")
    if device.type == "cuda":
        print(f"device: {torch.cuda.get_device_name(device)}, torch {torch.__version__}, CUDA {torch.version.cuda}")
    else:
        print("CPU self-test: the checks' logic only; nothing here is a GPU result")
    failed = skipped = 0
    for name, fn in CHECKS:
        t0 = time.monotonic()
        try:
            msg = fn(device)
            status = "SKIP" if msg.startswith("skip") else "PASS"
            skipped += status == "SKIP"
        except Exception as e:  # a check that cannot run is a failed check, with its reason
            failed += 1
            status, msg = "FAIL", f"{type(e).__name__}: {e}"
            traceback.print_exc(file=sys.stderr)
        print(f"{status} {name}: {msg} ({time.monotonic() - t0:.1f} s)", flush=True)
    passed = len(CHECKS) - failed - skipped
    print(f"{passed} passed, {skipped} skipped, {failed} failed" + (" -- FAILED" if failed else ""))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
