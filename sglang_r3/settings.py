"""Every ``SGLANG_R3_*`` setting: its name, its parse, read once per process into ``Settings``.

The environment is the only channel from our launcher (or a fleet engine actor, or the user) into
SGLang's child processes, so names live here and nowhere else; code takes a ``Settings``, not
``os.environ``.
"""

from __future__ import annotations

import functools
import os
from dataclasses import dataclass
from typing import Mapping, Optional

ENABLED = "SGLANG_R3_ENABLED"  # capture on in every SGLang process (set by our launcher, or the user)
CPU = "SGLANG_R3_CPU"  # this process tree runs SGLang's CPU runtime (set by cpu.activate_cpu_runtime)
FORCE_CPU = "SGLANG_R3_FORCE_CPU"  # take the CPU runtime even where a GPU is visible (tests, dev)
CACHE = "SGLANG_R3_CACHE"  # folder for generated files (libcuda stand-in, embedded model, test checkpoints)
DEFAULT_ROUTING = "SGLANG_R3_DEFAULT_ROUTING"  # routing for a /generate that does not ask (--r3-default-routing)
HEALTH = "SGLANG_R3_HEALTH"  # slime integration: each step's R3 health in slime's log
# Records by reference: set by a fleet engine actor on the launcher's environment (sglang_r3.fleet).
RECORD_STORE = "SGLANG_R3_RECORD_STORE"
RAY_NAMESPACE = "SGLANG_R3_RAY_NAMESPACE"
ENGINE_ID = "SGLANG_R3_ENGINE_ID"
ENGINE_INCARNATION = "SGLANG_R3_ENGINE_INCARNATION"
RAY_ADDRESS = "SGLANG_R3_RAY_ADDRESS"

DEFAULT_ROUTING_CHOICES = ("main", "main+mtp", "ref")  # ref: a handle into the fleet's record store


class SettingsError(ValueError):
    """A setting with a value we do not understand; the message names the variable."""


@dataclass(frozen=True)
class StoreSettings:
    """Where this engine's records go by reference (a fleet engine); None outside a fleet."""

    store: str
    namespace: str
    engine: str
    incarnation: int
    ray_address: str


@dataclass(frozen=True)
class Settings:
    enabled: bool = False
    cpu: bool = False
    force_cpu: bool = False
    cache: Optional[str] = None
    default_routing: Optional[str] = None
    health: bool = False
    store: Optional[StoreSettings] = None


def _flag(env: Mapping[str, str], name: str) -> bool:
    return env.get(name, "") == "1"


def parse(env: Mapping[str, str]) -> Settings:
    """``Settings`` from an environment mapping; a malformed value raises ``SettingsError`` naming it."""
    default_routing = env.get(DEFAULT_ROUTING) or None
    if default_routing is not None and default_routing not in DEFAULT_ROUTING_CHOICES:
        raise SettingsError(f"{DEFAULT_ROUTING} must be one of {', '.join(DEFAULT_ROUTING_CHOICES)}, "
                            f"got {default_routing!r}")
    store = None
    if env.get(RECORD_STORE):
        name = env[RECORD_STORE]
        try:
            incarnation = int(env.get(ENGINE_INCARNATION, "0"))
        except ValueError:
            raise SettingsError(f"{ENGINE_INCARNATION} must be an integer, got {env[ENGINE_INCARNATION]!r}") from None
        store = StoreSettings(store=name, namespace=env.get(RAY_NAMESPACE, "sglang_r3"),
                              engine=env.get(ENGINE_ID, name), incarnation=incarnation,
                              ray_address=env.get(RAY_ADDRESS, "auto"))
    return Settings(enabled=_flag(env, ENABLED), cpu=_flag(env, CPU), force_cpu=_flag(env, FORCE_CPU),
                    cache=env.get(CACHE) or None, default_routing=default_routing, health=_flag(env, HEALTH),
                    store=store)


@functools.cache
def current() -> Settings:
    """This process's settings, parsed on first use. A process that sets a variable for its children
    (``publish``) sees its own value too."""
    return parse(os.environ)


def publish(**values: str) -> Settings:
    """Set variables for this process and the SGLang processes it starts, and re-read ``current()``."""
    os.environ.update(values)
    current.cache_clear()
    return current()
