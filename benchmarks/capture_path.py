"""Capture hot path per forward at real shapes, in process: ours vs upstream SGLang's capturer logic.

One "forward" = the router of every main MoE layer handing its top-k ids to the capturer, then the
forward-end scatter of the staged rows into the host buffer at the batch's KV slots (the synchronous
path, ``no_copy_to_cpu=False``; on CPU there is no device and the device->host copies are no-ops).

* ours: ``RoutingCapturer.capture(layer_id, ids)`` for each of the MoE layers, then
  ``RoutingCapturer.on_forward_end(batch)`` (sglang_r3/serving/capture/capturer.py): staging uint8
  ``[max_tokens, n_moe, topk]``, host uint8 ``[slots, n_moe, topk]`` + a ``written`` mark per slot.
* upstream: SGLang 0.5.23's own ``BaseTopkCapturer.capture`` / ``.on_forward_end`` and ``BaseDeviceCache``
  (sglang/srt/state_capturer/base.py), called unbound on an object holding a real ``BaseDeviceCache``
  (int32 ``[max_batch, num_hidden_layers, topk]``) and an int32 host buffer ``[slots, num_hidden_layers,
  topk]``. Only the host buffer is built by hand: upstream allocates it pinned, which needs a GPU.
  ``RoutedExpertsCapturer.capture`` adds a width check and a DeepEP test before calling the base
  method; both are skipped here (they cost upstream, so skipping them leans its way).

Router output is int32 ``[tokens, topk]`` (what SGLang's TopK hands to the capture site) on both sides.
"""

from __future__ import annotations

import time
from types import SimpleNamespace
from typing import Any, Dict

import numpy as np
import torch

from benchmarks.shapes import GLM45, Shape, random_topk
from benchmarks.stats import bootstrap_ci, ratio_ci
from sglang_r3.serving.capture.capturer import RoutingCapturer

SIZES = (1, 32, 256, 8192)


def _upstream(shape: Shape, slots: int, max_batch: int):
    from sglang.srt.state_capturer.base import BaseDeviceCache, BaseTopkCapturer

    up = object.__new__(BaseTopkCapturer)
    up.num_layers, up.topk_size = shape.num_hidden_layers, shape.topk
    up.device_cache = BaseDeviceCache(max_batch, shape.num_hidden_layers, shape.topk, "cpu", name="routed_experts")
    up.host_cache = SimpleNamespace(buffer=torch.zeros((slots, shape.num_hidden_layers, shape.topk), dtype=torch.int32))
    return up, BaseTopkCapturer


def measure(shape: Shape = GLM45, sizes=SIZES, repeats: int = 30, slots: int = 32768) -> Dict[str, Any]:
    torch.set_num_threads(1)
    max_batch = max(sizes)
    ours = RoutingCapturer(shape.layout(), num_slots=slots, max_batch_tokens=max_batch)
    up, Base = _upstream(shape, slots, max_batch)
    rng = np.random.default_rng(0)
    moe = list(shape.moe_layer_ids)
    out: Dict[str, Any] = {"shape": shape.name, "moe_layers": len(moe), "topk": shape.topk,
                           "num_experts": shape.num_experts, "host_slots": slots, "repeats": repeats, "sizes": {}}
    for n in sizes:
        ids = [torch.from_numpy(random_topk(rng, n, shape.num_experts, shape.topk, np.int32)) for _ in moe]
        loc = torch.from_numpy(rng.choice(slots, n, replace=False).astype(np.int64))
        fb = SimpleNamespace(out_cache_loc=loc, out_cache_loc_virtual=None)

        def run_ours():
            for lid, x in zip(moe, ids):
                ours.capture(lid, x)
            ours.on_forward_end(fb)

        def run_up():
            for lid, x in zip(moe, ids):
                Base.capture(up, lid, x)
            Base.on_forward_end(up, fb, False, None)

        run_ours(), run_up()  # warm-up; then the same rows on every side
        assert torch.equal(ours.host[loc].to(torch.int32), up.host_cache.buffer[loc][:, moe, :])
        assert bool(ours.written[loc].all())
        inner = max(1, 2000 // n)  # forwards per timed sample: small batches are timed over many forwards
        t = {"ours": [], "upstream": []}
        sides = [("ours", run_ours), ("upstream", run_up)]
        for i in range(repeats):
            for name, fn in sides[i % 2 :] + sides[: i % 2]:  # alternating order
                t0 = time.perf_counter()
                for _ in range(inner):
                    fn()
                t[name].append((time.perf_counter() - t0) / inner * 1e6)
        out["sizes"][str(n)] = {
            "ours_us": {k: round(v, 1) for k, v in bootstrap_ci(t["ours"]).items() if k != "n"},
            "upstream_us": {k: round(v, 1) for k, v in bootstrap_ci(t["upstream"]).items() if k != "n"},
            "ours_over_upstream": ratio_ci(t["ours"], t["upstream"]),
        }
    out["worst_ours_over_upstream"] = max(v["ours_over_upstream"]["value"] for v in out["sizes"].values())
    return out


if __name__ == "__main__":
    import json

    print(json.dumps(measure(repeats=10), indent=1))

