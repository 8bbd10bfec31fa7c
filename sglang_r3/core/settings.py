"""Every ``SGLANG_R3_*`` setting (name, parse, read once per process) and the SGLang settings capture needs.

The environment is the only channel from our launcher (or a fleet engine actor, or the user) into
SGLang's child processes, so names live here and nowhere else; code takes a ``Settings``, not
``os.environ``. ``CAPTURE_NEEDS`` is the one list our launcher adds and the opt-in checks.
"""

from __future__ import annotations

import functools
import os
from dataclasses import dataclass
from typing import Any, Callable, Dict, List, Mapping, Optional

ENABLED = "SGLANG_R3_ENABLED"
CPU = "SGLANG_R3_CPU"
FORCE_CPU = "SGLANG_R3_FORCE_CPU"
CACHE = "SGLANG_R3_CACHE"
DEFAULT_ROUTING = "SGLANG_R3_DEFAULT_ROUTING"
HEALTH = "SGLANG_R3_HEALTH"
RECORD_STORE = "SGLANG_R3_RECORD_STORE"
RAY_NAMESPACE = "SGLANG_R3_RAY_NAMESPACE"
ENGINE_ID = "SGLANG_R3_ENGINE_ID"
ENGINE_INCARNATION = "SGLANG_R3_ENGINE_INCARNATION"
RAY_ADDRESS = "SGLANG_R3_RAY_ADDRESS"

MEANING: Dict[str, str] = {
    ENABLED: "routing capture on in every SGLang process (set by our launcher, or by the user for SGLang's own)",
    CPU: "this process tree runs SGLang's CPU runtime (set by cpu.activate_cpu_runtime)",
    FORCE_CPU: "take the CPU runtime even where a GPU is visible (tests, development)",
    CACHE: "folder for generated files (libcuda stand-in, embedded model, test checkpoints)",
    DEFAULT_ROUTING: "which routing a /generate that does not ask gets (our launcher's --r3-default-routing)",
    HEALTH: "slime integration: each training step's R3 health in slime's log",
    # Records by reference: set by a fleet engine actor for its launcher (sglang_r3.serving.fleet).
    RECORD_STORE: "the Ray actor name of this engine's record store",
    RAY_NAMESPACE: "the Ray namespace of that store",
    ENGINE_ID: "this engine's id in its fleet",
    ENGINE_INCARNATION: "this engine's restart generation",
    RAY_ADDRESS: "the Ray cluster the store lives in",
}

DEFAULT_ROUTING_CHOICES = ("main", "main+mtp", "ref")  # ref: a handle into the fleet's record store
DEFAULT_NAMESPACE = "sglang_r3"  # Ray namespace of every fleet's named actors


class SettingsError(ValueError):
    """A setting with a value we do not understand; the message names the variable."""

    def __init__(self, name: str, value: str, expected: str):
        self.name, self.value, self.expected = name, value, expected
        super().__init__(f"{name} must be {expected}, got {value!r} ({name}: {MEANING[name]})")


@dataclass(frozen=True)
class StoreSettings:
    """Where this engine's records go by reference (a fleet engine); None outside a fleet."""

    store: str
    namespace: str = DEFAULT_NAMESPACE
    engine: str = ""
    incarnation: int = 0
    ray_address: str = "auto"

    def environ(self) -> Dict[str, str]:
        """The variables that carry these settings to a launcher and its SGLang processes."""
        return {RECORD_STORE: self.store, RAY_NAMESPACE: self.namespace, ENGINE_ID: self.engine or self.store,
                ENGINE_INCARNATION: str(self.incarnation), RAY_ADDRESS: self.ray_address}


@dataclass(frozen=True)
class Settings:
    enabled: bool = False
    cpu: bool = False
    force_cpu: bool = False
    cache: Optional[str] = None
    default_routing: Optional[str] = None
    health: bool = False
    store: Optional[StoreSettings] = None


TRUE_SPELLINGS = ("1", "true", "yes", "on")
FALSE_SPELLINGS = ("0", "false", "no", "off")
SWITCH_EXPECTED = f"{'/'.join(TRUE_SPELLINGS)} (on) or {'/'.join(FALSE_SPELLINGS)} / unset (off), in any case"


def _flag(env: Mapping[str, str], name: str) -> bool:
    """A switch: the usual spellings in any case (surrounding blanks ignored), unset or empty is off."""
    value = env.get(name, "")
    spelled = value.strip().lower()
    if spelled in TRUE_SPELLINGS:
        return True
    if spelled in FALSE_SPELLINGS or spelled == "":
        return False
    raise SettingsError(name, value, SWITCH_EXPECTED)


def parse(env: Mapping[str, str]) -> Settings:
    """``Settings`` from an environment mapping; a malformed value raises ``SettingsError`` naming it."""
    default_routing = env.get(DEFAULT_ROUTING) or None
    if default_routing is not None and default_routing not in DEFAULT_ROUTING_CHOICES:
        raise SettingsError(DEFAULT_ROUTING, default_routing, "|".join(DEFAULT_ROUTING_CHOICES))
    store = None
    if env.get(RECORD_STORE):
        name = env[RECORD_STORE]
        try:
            incarnation = int(env.get(ENGINE_INCARNATION) or "0")
        except ValueError:
            raise SettingsError(ENGINE_INCARNATION, env[ENGINE_INCARNATION], "an integer") from None
        store = StoreSettings(store=name, namespace=env.get(RAY_NAMESPACE) or DEFAULT_NAMESPACE,
                              engine=env.get(ENGINE_ID) or name, incarnation=incarnation,
                              ray_address=env.get(RAY_ADDRESS) or "auto")
    return Settings(enabled=_flag(env, ENABLED), cpu=_flag(env, CPU), force_cpu=_flag(env, FORCE_CPU),
                    cache=env.get(CACHE) or None, default_routing=default_routing, health=_flag(env, HEALTH),
                    store=store)


@functools.cache
def current() -> Settings:
    """This process's settings, parsed on first use. A process that sets a variable for its children
    (``publish``) sees its own value too."""
    return parse(os.environ)


def publish(values: Optional[Mapping[str, str]] = None, /, **more: str) -> Settings:
    """Set variables (by name: ``publish({settings.ENABLED: "1"})``) for this process and the SGLang
    processes it starts, and re-read ``current()``."""
    updates = {**(values or {}), **more}
    unknown = sorted(set(updates) - set(MEANING))
    if unknown:
        raise KeyError(f"not an sglang-r3 setting: {', '.join(unknown)}")
    os.environ.update(updates)
    current.cache_clear()
    return current()


# -- what routing capture needs from SGLang's own settings --------------------------------------------

ALWAYS, ON_CPU, ON_CPU_HYBRID_SWA = "always", "cpu", "cpu+hybrid-swa"
_CPU_WHY = "this host has no GPU, and SGLang runs here only on its CPU runtime with this setting"


@dataclass(frozen=True)
class Need:
    """A SGLang server setting capture needs: our launcher adds it unless the user gave the flag, and under
    SGLang's own launchers (opt-in) a launch without it is refused, naming it."""

    flag: str  # as typed, "--attention-backend torch_native"
    reason: str  # why; "{resolved}" is filled with ``resolved(cfg)``
    met: Callable[[Any], bool]  # satisfied on SGLang's resolved ServerArgs (view)
    when: str = ALWAYS  # ALWAYS, ON_CPU (the CPU runtime), ON_CPU_HYBRID_SWA (and a separate sliding-window KV pool)
    resolved: Optional[Callable[[Any], str]] = None

    @property
    def argv(self) -> List[str]:
        return self.flag.split(" ")

    def why(self, cfg) -> str:
        return self.reason.format(resolved=self.resolved(cfg)) if self.resolved else self.reason


def _backends(cfg) -> set:
    return {cfg.attention_backend, cfg.decode_attention_backend, cfg.prefill_attention_backend} - {None}


def _cuda_graphs_off(cfg) -> bool:
    if cfg.disable_cuda_graph:
        return True
    graphs = cfg.cuda_graph_config
    phases = [getattr(graphs, p, None) for p in ("decode", "prefill")] if graphs is not None else []
    return bool(phases) and all(
        p is not None and str(getattr(p.backend, "value", p.backend)) == "disabled" for p in phases
    )


CAPTURE_NEEDS = (
    Need("--enable-return-routed-experts",
         "it turns on SGLang's per-request routing plumbing, which sglang-r3's capturer replaces; without it no "
         "request can get routing (slime passes it under --use-rollout-routing-replay)",
         lambda cfg: bool(cfg.enable_return_routed_experts)),
    Need("--device cpu", _CPU_WHY + " (device: {resolved})", lambda cfg: cfg.device == "cpu", ON_CPU,
         lambda cfg: repr(cfg.device)),
    Need("--attention-backend torch_native",
         _CPU_WHY + ": sglang-r3's CPU patches give MTP verify and draft passes to the torch_native backend "
         "(resolved: {resolved})",
         lambda cfg: _backends(cfg) == {"torch_native"}, ON_CPU,
         lambda cfg: ", ".join(sorted(map(str, _backends(cfg)))) or "none"),
    Need("--disable-overlap-schedule", _CPU_WHY, lambda cfg: bool(cfg.disable_overlap_schedule), ON_CPU),
    Need("--disable-cuda-graph", _CPU_WHY + " (CUDA graphs need a GPU)", _cuda_graphs_off, ON_CPU),
    # SGLang 0.5.23's torch_native backend reads a hybrid-SWA model's separate sliding-window KV pool by
    # full-pool slot ids; our launcher adds the flag on every CPU launch (no effect without SWA layers).
    Need("--disable-hybrid-swa-memory",
         _CPU_WHY + ": this model has sliding-window layers, and SGLang 0.5.23's torch_native backend reads "
         "their separate KV pool by full-pool slot ids (another slot's KV, or an IndexError); one full pool "
         "with the window as a mask is exact",
         lambda cfg: bool(cfg.disable_hybrid_swa_memory), ON_CPU_HYBRID_SWA),
)
NEEDS_BY_FLAG: Dict[str, Need] = {n.argv[0]: n for n in CAPTURE_NEEDS}


def flags_to_add(*, cpu: bool) -> List[Need]:
    """The needs our launcher adds to an argv (on the CPU runtime every CPU one: the launcher adds the
    hybrid-SWA flag before it knows the model)."""
    return [n for n in CAPTURE_NEEDS if n.when == ALWAYS or cpu]
