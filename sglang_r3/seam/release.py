"""The SGLang releases the adapter serves, chosen once from the installed one, and every way they differ.

slime's image runs 0.5.15.post1 (its five patches change no target of ours); the suite pins 0.5.23. The rest of
the SGLang side (``serving/adapter/``, ``serving/refusals/``, ``cpu_runtime/``) asks this module instead of reading
a release-specific SGLang name: where a name moved (runtime
context getters, ``Req.kv``, the internal-state controller, ``ServerArgs.resolve_once``), the function here
knows both places, and the manifest lists each place with the releases it is on. Where SGLang behaves otherwise,
a capability here says what differs (``has_internal_state_controller()``, ``topk_format_decided_per_forward()``,
``cpu_runtime_stops()``, ...), each naming the SGLang file it reads on each release: no other module of
``sglang_r3`` tests the version (``is_0_5_15`` is this module's own). A release outside ``SERVED`` is refused at
start-up, naming it and the manifest entries that differ from the nearest served release.
"""

from __future__ import annotations

import functools
import sys
from typing import Any, Callable, List, Mapping, NamedTuple, Optional, Sequence, Tuple

from sglang_r3.seam.versions import SERVED, V0_5_15, V0_5_23, installed, nearest

__all__ = ["SERVED", "V0_5_15", "V0_5_23", "UnsupportedRelease", "current", "installed", "is_0_5_15"]


class UnsupportedRelease(RuntimeError):
    """The installed SGLang is not a release the adapter was proven on."""

    def __init__(self, version: str, nearest: str, differences: Sequence[Tuple[str, str]]):
        self.version, self.nearest, self.differences = version, nearest, list(differences)
        lines = [f"sglang-r3 refuses to start: SGLang {version} is installed; sglang-r3 serves SGLang "
                 f"{' and '.join(SERVED)} (each proven by served runs)."]
        if differences:
            lines.append(f"Against {nearest}, the nearest served release, these targets differ:")
            lines += [f"  {t}: {why}" for t, why in differences]
        else:
            lines.append(f"Every target matches {nearest}'s, but no served run proved this release.")
        lines.append(f"Install sglang=={nearest} (or another of {', '.join(SERVED)}), or unset SGLANG_R3_ENABLED.")
        super().__init__("\n".join(lines))


@functools.cache
def current() -> str:
    """The installed release if it is served; otherwise ``UnsupportedRelease`` with what differs."""
    version = installed()
    if version in SERVED:
        return version
    from sglang_r3.seam.manifest import check

    near = nearest(version)
    raise UnsupportedRelease(version, near, check(release=near))


def is_0_5_15() -> bool:
    """The installed release is 0.5.15.post1: asked by this module's capabilities only."""
    return current() == V0_5_15


# -- scheduler: what the capturer is sized and switched by ------------------------------------------


def capture_requested(runner) -> bool:
    """--enable-return-routed-experts, as this scheduler's resolved ServerArgs say."""
    from sglang.srt.runtime_context import get_server_args

    return bool(get_server_args().enable_return_routed_experts)


class Limits(NamedTuple):
    chunked_prefill_size: Optional[int]
    max_prefill_tokens: Optional[int]
    speculative_algorithm: Optional[str]
    speculative_num_draft_tokens: Optional[int]
    cutedsl_moe_max_num_tokens: int


def forward_limits() -> Limits:
    """The server limits that bound one forward's token count (the staging buffer is sized from them once),
    from this scheduler's resolved ServerArgs (0.5.23's runtime-context bags publish the same values)."""
    from sglang.srt.runtime_context import get_server_args

    a = get_server_args()
    if is_0_5_15():
        cutedsl = a.cutedsl_moe_max_num_tokens()
    else:
        from sglang.srt.runtime_context import cutedsl_moe_max_num_tokens

        cutedsl = cutedsl_moe_max_num_tokens()
    return Limits(a.chunked_prefill_size, a.max_prefill_tokens, a.speculative_algorithm,
                  a.speculative_num_draft_tokens, int(cutedsl))


def kv_slot_capacity(runner) -> int:
    """How many KV slot ids out_cache_loc can hold: the host buffer's row count."""
    if is_0_5_15():
        # Upstream 0.5.15 sizes its own host buffer max_total_num_tokens + page_size (model_runner.py
        # init_routed_experts_capturer); a hybrid-SWA pool's full pool may be larger, so take both.
        return int(max(runner.max_token_pool_size, runner.max_total_num_tokens) + runner.page_size)
    return int(runner.kv_index_translator.capture_token_capacity(runner.max_token_pool_size))


class PdRowsCarrier(NamedTuple):
    """The KV transfer's state type the prompt's rows ride under PD (adapter/pd_rows.py): one whose payload is the
    request's full KV page ids on both engines and which the transfer sends as one flat region per buffer."""

    state_type: str  # a StateType member's name
    layer_ids: bool  # append_state_component takes layer ids (the flat layout is asked for by them)
    used_by: str  # what else uses the type: a pool that does cannot carry the rows


def pd_rows_carrier() -> PdRowsCarrier:
    if is_0_5_15():
        # MINIMAX_INDEX_K: the page-indexed payload (prefill.py / decode.py _dsa_payload) sent with force_flat
        # (mooncake/conn.py maybe_send_extra)
        return PdRowsCarrier("MINIMAX_INDEX_K", False, "a MiniMax sparse-attention index-K pool")
    # BLOCK_SCALE: the payload _full_kv_pages_payload; layer ids keep it flat (plain MHA splits entries in K/V halves)
    return PdRowsCarrier("BLOCK_SCALE", True, "an MXFP8 KV cache's per-block scales (--kv-cache-dtype mxfp8)")


# 0.5.15.post1: the key under which a PD engine's TokenizerManager stamps the version it serves into a request's
# sampling params (custom_params travel to the scheduler with the request; its scheduler holds no version of its own).
WEIGHT_VERSION_STAMP = "sglang_r3_weight_version"
# 0.5.15.post1: where a PD decode engine's request keeps its prefill engine's weight version for its routing payload.
PREFILL_VERSION_ATTR = "_r3_prefill_weight_version"


def served_weight_version(req) -> Optional[str]:
    """The weight version this scheduler serves ``req`` with. 0.5.23: ``get_serving()``, kept current by
    ``/update_weight_version`` and weight updates. 0.5.15.post1, whose scheduler holds only the start-up
    ``--weight-version``: what its TokenizerManager stamped into the request (``weight_version_stamp_target``), None
    where nothing was stamped."""
    if is_0_5_15():
        params = req.sampling_params.custom_params
        return params.get(WEIGHT_VERSION_STAMP) if isinstance(params, dict) else None
    from sglang.srt.runtime_context import get_serving

    return str(get_serving().weight_version)


def file_prefill_weight_version(req, version: str) -> None:
    """A PD decode engine's request whose prompt was computed under another weight version (``version``, its prefill
    engine's): 0.5.23 files it as SGLang does a weight update after the request's first output token
    (``WeightVersionEvent``; the output's ``weight_versions`` spans name both); 0.5.15.post1 keeps it on the request
    for its routing payload (adapter/capture_site.py; ``response.build`` adds it to the spans)."""
    if is_0_5_15():
        setattr(req, PREFILL_VERSION_ATTR, version)
        return
    from sglang.srt.utils.weight_versions import WeightVersionEvent

    req.weight_version_events.insert(0, WeightVersionEvent(old_version=version, num_output_tokens=1))


def weight_version_stamp_target() -> Optional[str]:
    """The TokenizerManager method whose tokenized request a PD engine stamps with the version it serves (an AFTER
    hook; it returns the tokenized request); None on 0.5.23, whose scheduler knows the version itself."""
    if is_0_5_15():
        return "sglang.srt.managers.tokenizer_manager.TokenizerManager._create_tokenized_object"
    return None


def pd_retraction_targets() -> Tuple[str, str]:
    """Where a PD decode engine copies a retracted request's KV out, and back into new slots on resume: (before
    hook, after hook). Both take the request first and its ReqToTokenPool among the rest."""
    if is_0_5_15():
        return ("sglang.srt.managers.schedule_batch.Req.offload_kv_cache",
                "sglang.srt.managers.schedule_batch.Req.load_kv_cache")
    return ("sglang.srt.managers.schedule_batch.backup_kv_cache", "sglang.srt.disaggregation.decode.restore_kv_cache")


def req_pool_idx(req) -> int:
    """The request's row in ReqToTokenPool (0.5.23 moved it onto ``req.kv``)."""
    kv = getattr(req, "kv", None)
    return kv.req_pool_idx if kv is not None else req.req_pool_idx


def experts_capturer_getter() -> Callable[[], Any]:
    """The function that returns this scheduler's experts capturer (bound once: it runs per router call)."""
    if is_0_5_15():
        from sglang.srt.state_capturer.routed_experts import get_global_experts_capturer

        return get_global_experts_capturer
    from sglang.srt.runtime_context import get_resources

    return lambda: get_resources().experts_capturer


def shared_topk_slots(topk_config) -> int:
    """Fused shared-expert columns appended after a router's routed top-k."""
    if is_0_5_15():
        return int(getattr(topk_config, "num_fused_shared_experts", 0) or 0)
    return int(topk_config.num_shared_topk_slots)


def topk_format_decided_per_forward() -> bool:
    """Whether a router built without a top-k output format picks one per forward from the MoE runner backend
    (0.5.15.post1: ``layers/moe/topk.py`` ``TopK.forward_cuda`` asks ``get_moe_runner_backend()`` each call, so a
    fused runner may route inside its kernel where the config says nothing); 0.5.23's ``TopK.__init__`` fixes
    ``topk_config.output_format`` when the router is built."""
    return is_0_5_15()


def has_internal_state_controller() -> bool:
    """Whether /get_internal_state and /set_internal_state are served by a ``SchedulerInternalStateController``
    (0.5.23: ``managers/scheduler_components/internal_state.py``, the scheduler's ``internal_state``, its updates
    a table of ``_update_handlers``; the controller's ``.scheduler`` is the Scheduler) rather than by the
    Scheduler's own ``get_internal_state`` / ``set_internal_state`` (0.5.15.post1, ``managers/scheduler.py``)."""
    return not is_0_5_15()


def req_pool_frees_rows() -> bool:
    """Whether ReqToTokenPool frees rows by index (0.5.23: ``mem_cache/memory_pool.py`` ``free_rows(indices)``,
    which ``free(req)`` and the other paths that give rows back call) rather than only per request
    (0.5.15.post1: ``free(req)``)."""
    return not is_0_5_15()


# -- DP attention ------------------------------------------------------------------------------------


def dp_gather_readers() -> Tuple[Callable[[], Optional[List[int]]], Callable[[], int]]:
    """The readers of what SGLang published for the forward being routed, bound once (they run per router
    call): per-rank token counts as padded for the gather (None, or on 0.5.15 AttributeError, before any
    forward published them), and the gathered length."""
    from sglang.srt.layers.dp_attention import get_dp_global_num_tokens, get_global_dp_buffer_len

    return get_dp_global_num_tokens, get_global_dp_buffer_len


def dp_slot_getter() -> Callable[[Sequence[int]], int]:
    """counts -> this rank's slot in the gather (bound once)."""
    if is_0_5_15():
        from sglang.srt.runtime_context import get_parallel

        # As 0.5.15's own ForwardBatch.prepare_mlp_sync_batch picks num_tokens.
        return lambda counts: 0 if len(counts) == 1 else get_parallel().attn_dp_rank
    from sglang.srt.layers.dp_attention import dp_slot_in

    return dp_slot_in


def scatters_tokens(backend) -> bool:
    """Whether the MoE all-to-all backend scatters a batch's tokens across attention-TP ranks (DeepEP)."""
    if backend.is_deepep():
        return True
    return bool(getattr(backend, "is_deepep_v2", lambda: False)())  # 0.5.15 has no DeepEP v2


def dp_gather_has_cpu_path() -> bool:
    """Whether DP attention's gather runs on the CPU runtime as SGLang wrote it: 0.5.23's ``layers/dp_attention.py``
    copies a rank's rows with ``memcpy_cpu`` on CPU and its ``GroupCoordinator`` (``distributed/parallel_state.py``)
    all-gathers, reduce-scatters and all-to-alls with torch.distributed there; 0.5.15.post1 copies with
    ``memcpy_triton`` only and sends those collectives through ``sglang::reg_*`` ops registered for CUDA only."""
    return not is_0_5_15()


def pads_draft_extend_dummies() -> bool:
    """Whether DP attention's MLP-sync padding (``model_executor/forward_batch_info.py``
    ``ForwardBatch._pad_inputs_to_size``) gives a draft extend's dummy requests the spec's fixed per-request width
    and prefix 0 (0.5.23); 0.5.15.post1 pads ``extend_seq_lens`` with 0 and leaves ``extend_prefix_lens``
    unpadded."""
    return not is_0_5_15()


def seq_len_fill_method() -> str:
    """The attention backend method DP attention's MLP-sync padding asks for a padded request's sequence length
    (``ForwardBatch._pad_inputs_to_size``): 0.5.23 asks a CPU backend for ``get_cpu_graph_seq_len_fill_value``
    (only Intel AMX defines it), 0.5.15.post1 every backend for ``get_cuda_graph_seq_len_fill_value`` (torch_native
    inherits a base class's that raises)."""
    return "get_cuda_graph_seq_len_fill_value" if is_0_5_15() else "get_cpu_graph_seq_len_fill_value"


# -- launch: ServerArgs resolution -----------------------------------------------------------------


def resolved(server_args) -> Any:
    """The resolved view of a ServerArgs record (0.5.15 resolves in __post_init__: the record itself)."""
    if is_0_5_15():
        return server_args
    from sglang.srt.arg_groups.overrides import resolving_view

    return resolving_view(server_args)


def as_asked(server_args) -> Any:
    """The record's values before SGLang resolves it: 0.5.23 keeps them on the record (its resolved values
    live in a view), 0.5.15 overwrites them, so a copy is taken first."""
    if is_0_5_15():
        import copy

        return copy.copy(server_args)
    return server_args


def resolve(server_args) -> None:
    """Resolve the record if the release resolves on request (0.5.23's resolve_once; 0.5.15 did it already)."""
    if not is_0_5_15():
        server_args.resolve_once()


def raw_server_args(argv: Sequence[str]) -> Tuple[Any, Callable[[], Any]]:
    """(SGLang's ServerArgs record for ``argv`` as asked for, the call that resolves it): what start-up checks
    read before and after SGLang's resolution. 0.5.23 parses unresolved and resolves in ``resolve_once``;
    0.5.15 resolves inside the dataclass's ``__post_init__`` when the record is built, so the record is built
    with it deferred (for this call only) and resolved by calling it on that record, as construction would."""
    from sglang.srt.server_args import ServerArgs, prepare_server_args

    if not is_0_5_15():
        args = prepare_server_args(list(argv))
        return args, args.resolve_once
    resolve = ServerArgs.__dict__["__post_init__"]
    ServerArgs.__post_init__ = lambda self: None
    try:
        args = prepare_server_args(list(argv))
    finally:
        ServerArgs.__post_init__ = resolve
    return args, lambda: resolve(args)


def resolution_target() -> str:
    """The method whose call is SGLang's resolution of a ServerArgs record (start-up refusals hook around it)."""
    return "sglang.srt.server_args.ServerArgs." + ("__post_init__" if is_0_5_15() else "resolve_once")


def constructing_engine() -> bool:
    """Whether this call runs inside ``sglang.Engine.__init__``. 0.5.15 resolves an Engine's ServerArgs there,
    after ``load_plugins()`` and so before any hook of ours on that ``__init__`` (applied by the plugin)
    could mark the launch: the caller's frames say it instead (start-up only)."""
    frame = sys._getframe(1)
    while frame is not None:
        code = frame.f_code
        if code.co_name == "__init__" and frame.f_globals.get("__name__") == "sglang.srt.entrypoints.engine":
            return True
        frame = frame.f_back
    return False


def engine_resolves_args_in_init() -> bool:
    """Whether ``sglang.Engine.__init__`` resolves its ServerArgs (0.5.15.post1: ``entrypoints/engine.py`` builds the
    record there, after ``load_plugins()``, and the dataclass's ``__post_init__`` resolves it), so an Engine launch
    is marked from ``__init__`` (and the caller's frames, ``constructing_engine``); 0.5.23 resolves in
    ``Engine._launch_subprocesses`` (``resolve_once``)."""
    return is_0_5_15()


def resolution_finished(server_args) -> bool:
    return bool(getattr(server_args, "_resolution_finished", False))


def launch_argv(server_args) -> List[str]:
    """The command line, to name flags as typed (0.5.23 keeps it on the record; 0.5.15 does not)."""
    if is_0_5_15():
        import sys

        return list(sys.argv[1:])
    return (getattr(server_args, "_launch_command", None) or "").split()


def model_config_of(server_args):
    """The ModelConfig SGLang resolves for a ServerArgs record."""
    if is_0_5_15():
        return server_args.get_model_config()
    from sglang.srt.arg_groups.model_override_base import model_config_of as of

    return of(server_args)


def linear_attention_config(model_config) -> Any:
    """The config of a model's linear-attention layers (Mamba-2, gated delta-net, KDA, lightning) by SGLang's own
    test (the one that picks its hybrid attention backend), None for a model without them."""
    if is_0_5_15():  # a ModelRunner property there; it reads model_config, is_draft_worker and a registry cache
        from sglang.srt.model_executor import model_runner

        runner = object.__new__(model_runner.ModelRunner)
        runner.model_config, runner.is_draft_worker = model_config, False
        runner._linear_attn_registry_cache = model_runner._UNSET
        return runner.mambaish_config
    from sglang.srt.configs.hybrid_arch import mambaish_config

    return mambaish_config(model_config)


def attn_tp_size_of(cfg) -> int:
    if is_0_5_15():
        dp = cfg.dp_size if cfg.enable_dp_attention else 1
        return int(cfg.tp_size // dp // max(1, getattr(cfg, "attn_cp_size", 1)))
    from sglang.srt.runtime_context import attn_tp_size_of as of

    return int(of(cfg))


def cpu_rank_count(server_args) -> int:
    """Ranks SGLang's CPU runtime binds one thread set each (SGLANG_CPU_OMP_THREADS_BIND entries): 0.5.23
    binds dp x tp x pp (distributed/bootstrap.py), 0.5.15 one per TP rank (model_runner.py asserts it)."""
    if is_0_5_15():
        return int(server_args.tp_size)
    return int(server_args.dp_size) * int(server_args.tp_size) * int(server_args.pp_size)


def npu_topk_captures_physical_ids() -> bool:
    """Whether the NPU top-k calls the capture site after mapping logical experts to physical replicas
    (0.5.15.post1: ``hardware_backend/npu/moe/topk.py`` ``fused_topk_npu`` captures after
    ``topk_ids_logical_to_physical``; 0.5.23 captures the router's ids before)."""
    return is_0_5_15()


def has_draft_extend_graph_switch() -> bool:
    """Whether SGLang can turn off the draft-extend CUDA graphs alone (0.5.23: ``environ.py``
    ``SGLANG_DISABLE_DRAFT_EXTEND_CUDA_GRAPH``); 0.5.15.post1 captures them whenever decode CUDA graphs are on."""
    return not is_0_5_15()


def has_platform_spec_workers() -> bool:
    """Whether a speculative algorithm may name an out-of-tree platform worker (0.5.23:
    ``speculative/spec_info.py`` ``SpeculativeAlgorithm.get_platform_worker_cls``); 0.5.15.post1 has none."""
    return not is_0_5_15()


def grpc_port_means_a_grpc_server() -> bool:
    """Whether a resolved ``grpc_port`` says a gRPC server will serve (0.5.23: legacy SMG mode resolves one);
    0.5.15.post1's ``server_args.py`` sets it on every record (port + 10000) and starts a gRPC server only in
    ``grpc_mode``."""
    return not is_0_5_15()


def has_rust_http_server() -> bool:
    """Whether SGLang can serve HTTP with its Rust server instead of its FastAPI app (0.5.23: ``environ.py``
    ``SGLANG_RUST_SERVER``); 0.5.15.post1 has none."""
    return not is_0_5_15()


# 0.5.15.post1's own CPU path stops these (measured: served by our launcher there, each stopped in SGLang; served on
# its CPU runtime by 0.5.23, and on a GPU by either release).
_DSA_0_5_15 = (
    "SGLang 0.5.15.post1 stops a DSA model on the CPU runtime as it resolves its arguments: server_args.py's "
    "model-specific adjustments take every device but NPU and XPU for a GPU and ask "
    "torch.cuda.get_device_capability()"
)
_GDN_0_5_15 = (
    "SGLang 0.5.15.post1 cannot run a gated delta-net model on the CPU runtime: its CPU path "
    "(layers/attention/linear/kernels/gdn_triton.py) hands sgl-kernel 0.4.4's chunk_gated_delta_rule_cpu an "
    "initial_state_indices it does not take, and with MTP speculation its Mamba pool allocates the draft states on "
    "CUDA (sglang-r3's torch gated delta-net ops follow 0.5.23's CPU path)"
)
_CPU_RUNTIME_0_5_15_STOPS = {
    "GlmMoeDsaForCausalLM": _DSA_0_5_15, "DeepseekV32ForCausalLM": _DSA_0_5_15,
    "Qwen3NextForCausalLM": _GDN_0_5_15, "Qwen3_5MoeForCausalLM": _GDN_0_5_15,
    "Qwen3_5MoeForConditionalGeneration": _GDN_0_5_15,
}


def cpu_runtime_stops() -> Mapping[str, str]:
    """architecture -> why: the models this release's own CPU path cannot run, which start-up refuses before SGLang
    stops on them (startup_checks._release_cpu_runtime). 0.5.15.post1: DSA (its argument resolution asks CUDA for a
    device capability) and gated delta-net (its CPU prefill and MTP pool); none on 0.5.23."""
    return _CPU_RUNTIME_0_5_15_STOPS if is_0_5_15() else {}


# -- CPU runtime: what SGLang's own CPU path lacks on each release ----------------------------------------------


def speculative_kernels_have_cpu_path() -> bool:
    """Whether SGLang sends each speculative kernel to an ``sgl_kernel.*_cpu`` op on the CPU (0.5.23: its
    ``speculative/`` entry points branch on the CPU; cpu_runtime/ops/spec_ops.py gives the ops' torch versions); 0.5.15.post1's
    EAGLE entry points are Triton or CUDA-only sgl-kernel calls with no CPU branch (cpu_runtime/ops/eagle_0_5_15.py stands in
    for them)."""
    return not is_0_5_15()


def cpu_model_ports_apply() -> bool:
    """Whether the CPU runtime's model ports written against SGLang's newer CPU path apply: gated delta-net's norms,
    layer build, verify convolution and state commit (cpu_runtime/ops/gdn.py), Gemma-4 (cpu_runtime/families/gemma4.py), DSA (cpu_runtime/ops/dsa.py),
    Mamba-2 / Nemotron-H, LFM2-MoE and AFMoE. Their targets are 0.5.23's (``sglang.kernels.ops``,
    ``arg_groups.model_hook``, its CPU branches; the manifest lists them for 0.5.23 only). 0.5.15.post1 does not
    serve those families on its CPU runtime: its own CPU path stops DSA and gated delta-net
    (``cpu_runtime_stops``), and the others were never served there."""
    return not is_0_5_15()


def pins_host_tensors_unasked() -> bool:
    """Whether SGLang pins host tensors without asking whether pinning is available (0.5.15.post1:
    ``model_executor/forward_batch_info.py`` ``ForwardBatch.prepare_mlp_sync_batch``'s token counts and
    ``state_capturer/base.py`` ``BaseHostCache.__init__``, ``pin_memory=True``); 0.5.23 asks
    ``is_pin_memory_available``."""
    return is_0_5_15()


def draft_backends_are_stamped() -> bool:
    """Whether ``DraftBackendFactory._create_backend`` (``speculative/draft_utils.py``) takes ``stamps_children``
    (True exactly for the multi-step decode container) and a backend map's entry returns (stamp, backend) (0.5.23);
    0.5.15.post1 has no ``stamps_children`` (the decode container is the one its error template names) and an
    entry returns the backend itself."""
    return not is_0_5_15()


class ModelAdjustments(NamedTuple):
    """Where SGLang makes its model-specific ServerArgs adjustments, and the modules whose names they look up at
    each call."""

    target: str  # the adjustments: a function (0.5.23) or a ServerArgs method (0.5.15.post1)
    backends_module: str  # whose attention_backends_of the adjustments call
    triton_kernels_module: str  # whose is_triton_kernels_available gpt-oss's adjustment calls


def model_adjustments() -> ModelAdjustments:
    """0.5.23: ``arg_groups/model_hook.py`` ``handle_model_specific_adjustments``, reading ``attention_backends_of``
    from ``model_hook`` and gpt-oss's from ``arg_groups/model_overrides/gpt_oss.py``; 0.5.15.post1:
    ``ServerArgs._handle_model_specific_adjustments`` (``server_args.py``), whose ``_resolved_attention_backends``
    imports ``attention_backends_of`` from ``arg_groups/overrides.py`` at each call, as gpt-oss's
    ``is_triton_kernels_available`` is read there."""
    if is_0_5_15():
        return ModelAdjustments("sglang.srt.server_args.ServerArgs._handle_model_specific_adjustments",
                                "sglang.srt.arg_groups.overrides", "sglang.srt.arg_groups.overrides")
    return ModelAdjustments("sglang.srt.arg_groups.model_hook.handle_model_specific_adjustments",
                            "sglang.srt.arg_groups.model_hook", "sglang.srt.arg_groups.model_overrides.gpt_oss")


def prefill_pins_page_ids_for_sender() -> bool:
    """Whether a PD prefill engine hands a KV sender that says ``supports_host_tensor_indices`` (Mooncake's) its page
    ids as a page-locked host copy with a ``torch.cuda.Event`` (0.5.23: ``disaggregation/prefill.py``
    ``_send_kv_chunk``; cpu_runtime/platform/disaggregation.py turns it off on the CPU runtime); 0.5.15.post1 has no such path."""
    return not is_0_5_15()


# -- requests and responses ------------------------------------------------------------------------


def response_target() -> Tuple[str, int]:
    """(the TokenizerManager generator every output leaves through, positional index of its ``request``)."""
    tm = "sglang.srt.managers.tokenizer_manager.TokenizerManager"
    return (f"{tm}._wait_one_response", 1) if is_0_5_15() else (f"{tm}._stream_one_response", 2)


def has_body_contract() -> bool:
    """Whether SGLang checks a /generate body against a typed contract of its own (0.5.23's api_contract;
    0.5.15 declares the types on GenerateReqInput and enforces none)."""
    return not is_0_5_15()


def outputs_stamp_one_weight_version() -> bool:
    """Whether the TokenizerManager stamps each output with the one weight version current when it leaves
    (0.5.15.post1: ``managers/tokenizer_manager.py`` writes ``server_args.weight_version`` into its meta info; its
    weight updates are ``update_weights_from_*``), so adapter/outputs.py notes the updates to write the spans;
    0.5.23 keeps the versions per segment (the output's ``weight_versions`` spans, ``utils/weight_versions.py``)."""
    return is_0_5_15()


def contract_error(body) -> Optional[str]:
    """SGLang's own /generate body contract's answer (release with one, see has_body_contract)."""
    from sglang.srt.entrypoints.api_contract import generate_contract_error

    return generate_contract_error(body)


def metrics_enabled() -> bool:
    from sglang.srt.runtime_context import get_server_args

    return bool(get_server_args().enable_metrics)


def max_stop_regex_len() -> Optional[int]:
    """SGLang's limit on a stop regex (0.5.23); None: 0.5.15 parses every pattern, of any length."""
    if is_0_5_15():
        return None
    from sglang.srt.sampling.sampling_params import MAX_STOP_REGEX_LEN

    return int(MAX_STOP_REGEX_LEN)
