"""Every SGLang 0.5.23 target sglang-r3 touches, in one list, checked against the installed SGLang.

A hook that no longer fires is silent, and for R3 that means rows never captured or never checked.
So each target is named here with what we do to it and why, and the shape we wrote against: the
parameter names, kinds and defaults of a callable (annotations are left out: SGLang moves them
between strings and objects without changing a call). ``hooks.register`` refuses a target that is
not listed or whose signature differs; ``check`` resolves every entry (``python -m
sglang_r3.serving.patches.manifest`` prints the differences, for the next SGLang bump).

Kinds: ``hook`` (SGLang's HookRegistry: around / before / after / replace), ``instance`` (we
replace a method on one live object), ``adds`` (we add a method a class lacks; SGLang
defining it stops start-up), ``route`` (we change the app's route list), ``op`` (we add
operators to a namespace), ``uses`` (we call or read it; a private name is marked in ``why``).
"""

from __future__ import annotations

import inspect
from dataclasses import dataclass
from typing import Any, Dict, List, Optional, Tuple


@dataclass(frozen=True)
class Touch:
    target: str  # dotted path as SGLang's HookRegistry names it
    kind: str
    why: str
    signature: Optional[str] = None  # normalized (see ``signature_of``); None: not a callable we call into


_MR = "sglang.srt.model_executor.model_runner.ModelRunner"
_ISC = "sglang.srt.managers.scheduler_components.internal_state"
_TM = "sglang.srt.managers.tokenizer_manager.TokenizerManager"
_GRI = "sglang.srt.managers.io_struct.GenerateReqInput"
_EAGLE = "sglang.srt.speculative.eagle_worker_v2"
_POOL = "sglang.srt.mem_cache.memory_pool"
_SA = "sglang.srt.server_args.ServerArgs"
_TNA = "sglang.srt.layers.attention.torch_native_backend.TorchNativeAttnBackend"

MANIFEST: Tuple[Touch, ...] = (
    # -- capture (patches/capture.py) ---------------------------------------------------------------
    Touch(f"{_MR}.init_routed_experts_capturer", "hook:around",
          "install our capturer (layout, staging sized from the limits) instead of upstream's", "(self)"),
    Touch("sglang.srt.layers.moe.topk.capture_routed_experts_if_allowed", "hook:replace",
          "the single capture site: main routers to RoutingCapturer, draft routers to DraftCapturer",
          "(topk_config, layer_id, topk_ids)"),
    Touch("sglang.srt.managers.scheduler_components.batch_result_processor.SchedulerBatchResultProcessor"
          "._maybe_collect_routed_experts", "hook:around",
          "per-request gather at finish: rows and marks of req_to_token[start:T-1], missing rows refused",
          "(self, req)"),
    Touch(f"{_ISC}.SchedulerInternalStateController.get_internal_state", "hook:after",
          "capture counters (and requests held) for /routing/stats", "(self, recv_req)"),
    Touch(f"{_ISC}.SchedulerInternalStateController._update_handlers", "hook:after",
          "private: adds the sglang_r3_capture knob to /set_internal_state", "(self)"),
    Touch(f"{_ISC}._UpdateHandler", "uses", "private: the handler type _update_handlers returns",
          "(validate, apply)"),
    Touch(f"{_POOL}.MHATokenToKVPool.move_kv_cache", "instance",
          "tree drafting moves accepted KV; the wrapper on the live pool (of whichever KV pool class, all "
          "share this method's shape) moves rows and marks with it",
          "(self, tgt_loc, src_loc)"),
    Touch("sglang.srt.state_capturer.routed_experts.set_global_experts_capturer", "uses",
          "the capturer SGLang's forward ends call", "(capturer)"),
    # -- DP attention / DeepEP (patches/dp_rows.py) ----------------------------------------------------
    Touch("sglang.srt.layers.dp_attention.is_dp_attention_enabled", "uses",
          "whether MoE layers route the DP-gathered batch", "()"),
    Touch("sglang.srt.layers.dp_attention.get_dp_global_num_tokens", "uses",
          "the per-rank token counts (as padded for the gather) of the forward being routed", "()"),
    Touch("sglang.srt.layers.dp_attention.get_global_dp_buffer_len", "uses",
          "the gathered batch's length: a router that routed another count files nothing", "()"),
    Touch("sglang.srt.layers.dp_attention.dp_slot_in", "uses", "this rank's slot in the gather", "(per_rank)"),
    Touch("sglang.srt.layers.dp_attention.attn_tp_all_gather_into_tensor", "uses",
          "DeepEP: each router's share of the local batch gathered across attention-TP ranks, as upstream",
          "(output, input)"),
    Touch("sglang.srt.layers.moe.get_moe_a2a_backend", "uses", "DeepEP scatters tokens across attention-TP ranks",
          "()"),
    Touch("sglang.srt.runtime_context.get_parallel", "uses", "the attention-TP width", "()"),
    # -- draft (patches/draft.py) -----------------------------------------------------------------
    Touch(f"{_EAGLE}.EagleDraftWorker.draft", "hook:around",
          "draft guard and step numbering around every draft forward",
          "(self, batch, kw:with_topology=False)"),
    Touch(f"{_EAGLE}.EAGLEWorkerV2.forward_batch_generation", "hook:after",
          "accept lengths after the verify: draft entries marked accepted or rejected",
          "(self, batch, on_publish=None, grammar_barrier=None, pp_proxy_tensors=None)"),
    Touch("sglang.srt.speculative.multi_layer_eagle_worker_v2.MultiLayerEagleWorkerV2.forward_batch_generation",
          "hook:around",
          "multi-layer MTP: the verify's accept lengths resolve the drafts filed before it (its own draft-extend "
          "files the next round's); a prefill chunk drops its requests' unverified drafts",
          "(self, batch, on_publish=None, grammar_barrier=None, pp_proxy_tensors=None)"),
    Touch(f"{_POOL}.ReqToTokenPool.free_rows", "hook:after",
          "draft entries of a freed request row are dropped", "(self, indices)"),
    Touch(f"{_POOL}.ReqToTokenPool.alloc", "hook:after",
          "a new request row starts with no draft entries and its MTP wish", "(self, reqs)"),
    Touch(f"{_MR}.forward", "instance",
          "the draft runner's forward (each multi-layer MTP runner's too) is wrapped in the draft guard (main "
          "writes from it raise) and files its draft routing",
          "(self, forward_batch, skip_attn_backend_init=None, pp_proxy_tensors=None, "
          "reinit_attn_backend=False, split_forward_count=1)"),
    # -- requests and responses (patches/input_guard.py, patches/responses.py) -----------------------
    Touch(f"{_TM}._validate_one_request", "hook:around",
          "private: hostile input becomes a 400 naming the field instead of killing the scheduler",
          "(self, obj, input_ids)"),
    Touch(f"{_GRI}.normalize_batch_and_arguments", "hook:around",
          "a batch's sampling_params object is checked once", "(self)"),
    Touch(f"{_GRI}.__getitem__", "hook:around", "a batch item keeps its index for error messages", "(self, i)"),
    Touch(f"{_TM}._stream_one_response", "hook:around",
          "private: every output leaves here; ours gets the payload, others upstream's routed_experts",
          "(self, obj, state, request=None)"),
    # -- launch (patches/opt_in.py) --------------------------------------------------------------------
    Touch(f"{_SA}.resolve_once", "hook:around",
          "start-up refusals on SGLang's own resolved ServerArgs (opt-in launches)", "(self)"),
    Touch(f"{_SA}.check_server_args", "hook:before",
          "start-up refusals before SGLang's own checks", "(self)"),
    Touch("sglang.srt.server_args.prepare_server_args", "uses", "our launcher resolves argv as SGLang's does",
          "(argv)"),
    # -- starting SGLang (patches/api.py for launch_server.py, engine.py) ---------------------------------
    Touch("sglang.srt.plugins.load_plugins", "uses", "our launcher loads plugins before resolving argv", "()"),
    Touch("sglang.launch_server.run_server", "hook:around",
          "our launcher runs SGLang's own server; under the opt-in (`sglang serve`) it marks an HTTP launch, whose "
          "refusals exit instead of raising", "(server_args)"),
    Touch("sglang.srt.entrypoints.engine.Engine._launch_subprocesses", "hook:around",
          "under the opt-in: marks an in-process sglang.Engine launch (unless an HTTP launch runs it), whose "
          "refusals raise to the caller",
          "(server_args, init_tokenizer_manager_func, run_scheduler_process_func, run_detokenizer_process_func, "
          "port_args=None, placement_group=None)"),
    Touch("sglang.srt.utils.kill_process_tree", "uses", "clean-up after the server returns, as SGLang's launcher",
          "(parent_pid, include_parent=True, skip_pid=None, wait_timeout=60)"),
    Touch("sglang.srt.entrypoints.engine.Engine", "uses", "sglang_r3.serving.engine.Engine builds SGLang's in-process engine",
          "(**kwargs)"),
    Touch("sglang.srt.runtime_context.get_observability", "uses",
          "whether this process serves /metrics (the probe sglang_r3.serving.metrics asks)", "()"),
    Touch("sglang.srt.plugins.hook_registry.HookRegistry", "uses",
          "registers every hook; its private _patched set tells which were applied"),
    Touch("sglang.srt.plugins.hook_registry._current_plugin_source", "uses",
          "private: whether hooks are being collected inside load_plugins (apply now or later)"),
    # -- HTTP (patches/http.py; patches/api.py for server/) -----------------------------------------------
    Touch("sglang.srt.entrypoints.http_server.app", "route",
          "our /generate takes the place of SGLang's in the app's route list; /routing/* added"),
    Touch("sglang.srt.entrypoints.http_server.get_global_state", "uses", "the TokenizerManager of the app", "()"),
    Touch("sglang.srt.entrypoints.http_server._create_error_response", "uses",
          "private: SGLang's own error body for a failed /generate", "(e)"),
    Touch("sglang.srt.entrypoints.api_contract.generate_contract_error", "uses",
          "SGLang's /generate body contract, applied before ours", "(body)"),
    Touch("sglang.srt.utils.auth.auth_level", "uses", "admin auth for /routing/capture", "(level)"),
    Touch("sglang.srt.utils.auth.AuthLevel", "uses", "ADMIN_OPTIONAL: the level of /routing/capture"),
    Touch("sglang.srt.managers.io_struct.GenerateReqInput", "uses", "our /generate builds SGLang's request object"),
    Touch("sglang.srt.managers.io_struct.SetInternalStateReq", "uses", "POST /routing/capture sets the capture knob"),
    Touch("sglang.srt.utils.json_response.orjson_response", "uses", "JSON responses as SGLang writes them"),
    Touch("sglang.srt.utils.json_response.dumps_json", "uses", "stream frames as SGLang writes them"),
    # -- CPU runtime (patches/cpu/) -------------------------------------------------------------------------
    Touch(f"{_TNA}.forward_extend", "hook:around",
          "TARGET_VERIFY / DRAFT_EXTEND on the torch_native backend (CPU only)",
          "(self, q, k, v, layer, forward_batch, save_kv_cache=True)"),
    Touch(f"{_TNA}.forward_decode", "hook:around", "draft decode on the torch_native backend (CPU only)",
          "(self, q, k, v, layer, forward_batch, save_kv_cache=True)"),
    Touch("sglang.srt.speculative.draft_utils.DraftBackendFactory._create_backend", "hook:around",
          "private: the draft attention backend on CPU",
          "(self, backend_name, backend_map, error_template, stamps_children=False)"),
    Touch("sglang.srt.distributed.parallel_state.init_model_parallel_group", "hook:around",
          "CPU only: process groups without pynccl (it refuses a CPU device), so TP / DP attention run on gloo",
          "(group_ranks, local_rank, backend, use_pynccl=None, use_custom_allreduce=None, "
          "use_message_queue_broadcaster=False, group_name=None, use_mscclpp=None, "
          "use_torch_symm_mem_allreduce=None, recovered_rank=False, rank_offset=0, max_world_size=None)"),
    Touch("sglang.srt.models.llama4.Llama4Attention.forward", "hook:around",
          "CPU only: Llama 4 attention with RoPE's returned q/k and a float32 QK norm (its non-CUDA branch drops "
          "the rotation, which CUDA applies in place, and casts q/k to bfloat16)",
          "(self, positions, hidden_states, forward_batch)"),
    Touch("sglang.srt.layers.moe.fused_moe_native.moe_forward_native", "hook:around",
          "CPU only: top-1 experts that weigh their input (Llama 4's apply_router_weight_on_input), which it refuses",
          "(layer, x, topk_output, moe_runner_config)"),
    Touch(f"{_TNA}.get_cpu_graph_seq_len_fill_value", "adds",
          "CPU only: the padded-row sequence length DP-attention padding asks for (1, as Intel AMX's); "
          "start-up stops if SGLang defines it itself"),
    Touch("sglang.srt.arg_groups.model_override_base.model_config_of", "uses",
          "start-up checks read the model config SGLang resolves (multi-layer MTP layout; hybrid-SWA pool on CPU)",
          "(server_args)"),
    Touch("sglang.srt.mem_cache.pool_host.common.ALLOC_MEMORY_FUNCS", "uses",
          "CPU only: the 'cpu' entry allocates host pools without cudaHostRegister (no GPU to pin for)"),
    Touch("sgl_kernel", "op", "torch versions of the *_cpu speculative ops sgl-kernel's CPU paths call"),
)

BY_TARGET: Dict[str, Touch] = {t.target: t for t in MANIFEST}


def signature_of(obj: Any) -> Optional[str]:
    """Parameter names, kinds and defaults of a callable, e.g. ``(self, batch, kw:with_topology=False)``."""
    try:
        sig = inspect.signature(obj)
    except (TypeError, ValueError):
        return None
    out = []
    for p in sig.parameters.values():
        s = {p.VAR_POSITIONAL: "*", p.VAR_KEYWORD: "**", p.KEYWORD_ONLY: "kw:"}.get(p.kind, "") + p.name
        if p.default is not p.empty:
            s += "=" + repr(p.default)
        out.append(s)
    return "(" + ", ".join(out) + ")"


def problem(target: str, obj: Any, kind: Optional[str] = None) -> Optional[str]:
    """Why ``obj`` (what ``target`` resolved to) is not what sglang-r3 was written against, or None."""
    entry = BY_TARGET.get(target)
    if entry is None:
        return "not listed in sglang_r3/serving/patches/manifest.py (every SGLang target must be)"
    if kind is not None and not entry.kind.startswith(kind):
        return f"listed as {entry.kind!r}, touched as {kind!r}"
    if entry.signature is not None:
        now = signature_of(obj)
        if now != entry.signature:
            return f"signature changed: written against {entry.signature}, installed {now}"
    return None


def check(entries: Tuple[Touch, ...] = MANIFEST) -> List[Tuple[str, str]]:
    """(target, why) for every entry that is missing or changed in the installed SGLang."""
    from sglang_r3.serving.patches.resolve import describe_error, resolve

    out = []
    for e in entries:
        if e.kind == "adds":  # the class must be there and still lack it (or hold ours)
            owner, _, name = e.target.rpartition(".")
            try:
                have = getattr(resolve(owner), name, None)
            except Exception as exc:  # noqa: BLE001
                out.append((e.target, describe_error(exc)))
                continue
            if have is not None and getattr(have, "__module__", "").split(".")[0] != "sglang_r3":
                out.append((e.target, "SGLang now defines it: sglang-r3's CPU stand-in would replace it"))
            continue
        try:
            obj = resolve(e.target)
        except Exception as exc:  # noqa: BLE001 -- ImportError, AttributeError, or the module's own error
            out.append((e.target, describe_error(exc)))
            continue
        if e.signature is not None and signature_of(obj) != e.signature:
            out.append((e.target, f"signature changed: written against {e.signature}, installed {signature_of(obj)}"))
    return out


def markdown() -> str:
    """The manifest as the table in docs/architecture.md (``--markdown``; a test keeps the two equal)."""
    lines = ["| target | kind | why | signature written against |", "|---|---|---|---|"]
    for e in MANIFEST:
        sig = f"`{e.signature}`" if e.signature else ""
        lines.append(f"| `{e.target}` | {e.kind} | {e.why} | {sig} |")
    return "\n".join(lines) + "\n"


def main(argv: Optional[List[str]] = None) -> int:
    import sys

    if "--markdown" in (sys.argv[1:] if argv is None else argv):
        print(markdown(), end="")
        return 0
    from sglang_r3.dev.cpu import activate_cpu_runtime, has_gpu

    if not has_gpu():  # sgl-kernel's modules need the libcuda stand-in to import on a CPU host
        activate_cpu_runtime()
    bad = check()
    for target, why in bad:
        print(f"CHANGED {target}: {why}")
    print(f"{len(MANIFEST) - len(bad)} of {len(MANIFEST)} SGLang targets as written against")
    return 1 if bad else 0


if __name__ == "__main__":
    raise SystemExit(main())
