"""SGLang's own launchers with capture: what ``SGLANG_R3_ENABLED=1`` adds where SGLang starts itself.

``python -m sglang.launch_server``, ``sglang.srt.entrypoints.http_server.launch_server(ServerArgs)``
(slime starts it in a ``multiprocessing.Process``) and ``sglang.Engine`` never run our launcher;
they only load our plugin. With the opt-in, the plugin installs the same patches in every
SGLang process (capture, draft, responses, input guard) and these two hooks on ``ServerArgs``,
which only the launching process ever calls:

* ``resolve_once`` (AROUND): ``check_supported`` before SGLang resolves the record, as our
  launcher does (several refused combinations also fail SGLang's own resolution, and the user
  should read our reason). Under ``http_server.launch_server`` called directly (slime's way)
  SGLang resolves before it loads plugins, so the next hook is the first chance.
* ``check_server_args`` (BEFORE): called once per launch by ``Engine._launch_subprocesses``
  after plugins are loaded and before SGLang publishes its configuration or starts any
  process. Here: every hook bound (``hooks.verify_applied``), ``check_supported`` on the
  resolved record, the settings capture needs (``--enable-return-routed-experts``; on a CPU-only
  host the CPU runtime's flags), and, for an HTTP server, our routes.

A refused HTTP launch exits with status 1 and the message (no traceback), like our launcher; a
refused ``sglang.Engine(...)`` raises the error to its caller.
"""

from __future__ import annotations

import functools
import os
import sys
from dataclasses import dataclass
from typing import List, Sequence

from sglang_r3.patches.hooks import register

ENABLE_ENV = "SGLANG_R3_ENABLED"
DEFAULT_ROUTING_ENV = "SGLANG_R3_DEFAULT_ROUTING"
DEFAULT_ROUTING_CHOICES = ("main", "main+mtp", "ref")  # as launch_server.DEFAULT_ROUTING_CHOICES

_SA = "sglang.srt.server_args.ServerArgs"
# Modules whose functions are on the stack when SGLang launches an HTTP server: run_server
# (sglang.launch_server, also under ``sglang serve``) resolves the record, http_server.launch_server
# (where slime's child starts) checks it.
_HTTP_LAUNCHERS = ("sglang.srt.entrypoints.http_server", "sglang.launch_server")

_checking: set = set()  # ids of records whose check_supported is running (it calls resolve_once itself)


@dataclass(frozen=True)
class Missing:
    flag: str  # what to add, as it is typed
    reason: str


class MissingSettingsError(ValueError):
    """The launch lacks a setting capture needs; one line per flag to add."""

    def __init__(self, missing: Sequence[Missing]):
        self.missing = list(missing)
        lines = [f"sglang-r3 ({ENABLE_ENV}=1) refuses to start: this launch lacks "
                 + ("a setting" if len(self.missing) == 1 else "settings") + " routing capture needs:"]
        lines += [f"  {m.flag}: {m.reason}" for m in self.missing]
        lines.append(f"Add the flag(s) above (`python -m sglang_r3.launch_server` adds them itself), "
                     f"or unset {ENABLE_ENV} to run SGLang without routing capture.")
        super().__init__("\n".join(lines))

    @property
    def flags(self) -> List[str]:
        return [m.flag for m in self.missing]


def on_cpu_runtime() -> bool:
    return os.environ.get("SGLANG_R3_CPU") == "1"  # set by cpu.activate_cpu_runtime


# -- what capture needs -------------------------------------------------------------------------


def _cuda_graphs_off(cfg) -> bool:
    if cfg.disable_cuda_graph:
        return True
    graphs = cfg.cuda_graph_config
    phases = [getattr(graphs, p, None) for p in ("decode", "prefill")] if graphs is not None else []
    return bool(phases) and all(
        p is not None and str(getattr(p.backend, "value", p.backend)) == "disabled" for p in phases
    )


_CPU_WHY = "this host has no GPU, and SGLang runs here only on its CPU runtime with this setting"


def _cpu_device_missing(device) -> Missing:
    return Missing("--device cpu", f"{_CPU_WHY} (device: {device!r})")


def missing_settings(cfg) -> List[Missing]:
    """Settings the resolved configuration ``cfg`` lacks. Nothing is added behind the caller's back:
    under ``http_server.launch_server(ServerArgs)`` the record is resolved before any plugin runs, so
    the only honest answer on every path is to name what to pass."""
    out: List[Missing] = []
    if not cfg.enable_return_routed_experts:
        out.append(Missing("--enable-return-routed-experts", (
            "it turns on SGLang's per-request routing plumbing, which sglang-r3's capturer replaces; "
            "without it no request can get routing (slime passes it under --use-rollout-routing-replay)"
        )))
    if on_cpu_runtime():
        why = _CPU_WHY
        if cfg.device != "cpu":
            out.append(_cpu_device_missing(cfg.device))
        backends = {cfg.attention_backend, cfg.decode_attention_backend, cfg.prefill_attention_backend} - {None}
        if backends != {"torch_native"}:
            out.append(Missing("--attention-backend torch_native", (
                f"{why}: sglang-r3's CPU patches give MTP verify and draft passes to the torch_native backend "
                f"(resolved: {', '.join(sorted(map(str, backends))) or 'none'})"
            )))
        if not cfg.disable_overlap_schedule:
            out.append(Missing("--disable-overlap-schedule", why))
        if not _cuda_graphs_off(cfg):
            out.append(Missing("--disable-cuda-graph", f"{why} (CUDA graphs need a GPU)"))
        if _hybrid_swa_pool(cfg):
            out.append(Missing("--disable-hybrid-swa-memory", (
                f"{why}: this model has sliding-window layers, and SGLang 0.5.23's torch_native backend reads "
                "their separate KV pool by full-pool slot ids (another slot's KV, or an IndexError); one full pool "
                "with the window as a mask is exact"
            )))
    value = os.environ.get(DEFAULT_ROUTING_ENV)
    if value and value not in DEFAULT_ROUTING_CHOICES:
        out.append(Missing(f"{DEFAULT_ROUTING_ENV}={'|'.join(DEFAULT_ROUTING_CHOICES)} (environment variable)",
                           f"got {value!r}; it says which routing a /generate that does not ask gets"))
    return out


def _hybrid_swa_pool(cfg) -> bool:
    """Whether SGLang would give this model's sliding-window layers a KV pool of their own."""
    if cfg.disable_hybrid_swa_memory:
        return False
    from sglang.srt.arg_groups.model_override_base import model_config_of

    return bool(model_config_of(cfg).is_hybrid_swa)


# -- the hooks ----------------------------------------------------------------------------------


def _http_launch() -> bool:
    """True when this launch runs inside ``http_server.launch_server`` (``python -m sglang.launch_server``,
    ``sglang serve`` and slime's child all do); false for an in-process ``sglang.Engine``."""
    frame = sys._getframe(1)
    while frame is not None:
        g = frame.f_globals
        # ``python -m sglang.launch_server`` runs that module as __main__; its spec keeps the name.
        if g.get("__name__") in _HTTP_LAUNCHERS or getattr(g.get("__spec__"), "name", None) in _HTTP_LAUNCHERS:
            return True
        frame = frame.f_back
    return False


_NOTE = f"({ENABLE_ENV}=1 turned routing capture on for this SGLang launch; unset it to run SGLang without.)"


def _refuse(err: Exception) -> None:
    # check_supported's message ends "serve with plain `python -m sglang.launch_server`": say how here.
    note = "" if isinstance(err, MissingSettingsError) else _NOTE
    if _http_launch():
        raise SystemExit("\n".join(filter(None, (str(err), note)))) from None  # stderr, status 1, no traceback
    if note:
        err.add_note(note)
    raise err


def refuse_unsupported_once_resolved(original, self, *args, **kwargs):
    if getattr(self, "_resolution_finished", False) or id(self) in _checking:
        return original(self, *args, **kwargs)
    from sglang_r3.patches.startup_checks import UnsupportedConfigError, check_supported

    _checking.add(id(self))
    try:
        if on_cpu_runtime() and self.device != "cpu":
            # SGLang may have picked its platform when it was imported, before this plugin prepared the
            # CPU runtime (python -m sglang.launch_server does); left to find the device itself, its
            # resolution then fails with "No accelerator".
            raise MissingSettingsError([_cpu_device_missing(self.device)])
        check_supported(self)  # raw pass, resolve_once (through this hook: the original), resolved pass
    except (UnsupportedConfigError, MissingSettingsError) as err:
        _refuse(err)
    finally:
        _checking.discard(id(self))
    return None


def refuse_unsupported_before_sglangs_checks(self, *args, **kwargs):
    from sglang.srt.arg_groups.overrides import resolving_view

    from sglang_r3.patches.hooks import HookTargetError, check_uses, verify_applied
    from sglang_r3.patches.startup_checks import UnsupportedConfigError, check_supported

    try:
        check_uses()  # this is the launching process: the names our routes and launch path call
        verify_applied()
        check_supported(self)  # idempotent; the only check when SGLang resolved before plugins loaded
        missing = missing_settings(resolving_view(self))
        if missing:
            raise MissingSettingsError(missing)
        if on_cpu_runtime():
            from sglang_r3.cpu import bind_rank_threads
            from sglang_r3.patches.api import cpu_rank_count

            bind_rank_threads(cpu_rank_count(self))  # before SGLang spawns a scheduler
    except (HookTargetError, UnsupportedConfigError, MissingSettingsError) as err:
        _refuse(err)
    if _http_launch():
        from sglang_r3.patches.http import install_http_routes

        install_http_routes()  # before _setup_and_run_http_server builds the server on this app
    return None


@functools.cache  # once per process, whichever process kinds install it
def install_launch_checks() -> None:
    register(f"{_SA}.resolve_once", refuse_unsupported_once_resolved, "around")
    register(f"{_SA}.check_server_args", refuse_unsupported_before_sglangs_checks, "before")
