"""SGLang's own launchers with capture on (the opt-in): our launcher's checks, where SGLang starts itself.

``python -m sglang.launch_server``, ``sglang serve``, ``http_server.launch_server(ServerArgs)`` (slime) and
``sglang.Engine`` never run our launcher. In the launching process these hooks refuse what capture cannot
serve (``check_supported``) and what it lacks (``settings.CAPTURE_NEEDS``), naming each flag: an HTTP launch
exits with the message (status 1, no traceback), an Engine raises it. ``launch`` says which it is.
"""

from __future__ import annotations

import functools
import sys
from dataclasses import dataclass, field
from typing import List, Optional, Sequence, Set

from sglang_r3.core import settings
from sglang_r3.seam.hooks import register


LAUNCH_KINDS = ("server", "engine", "http")


@dataclass
class Launch:
    """This process's part in a launch, set by whichever entry started it, read by the launch checks.

    kind: "server" (our launcher: it installs its own patches and checks, the plugin stays out), "engine"
    (an in-process Engine: ours, or SGLang's, marked by the hook on ``Engine._launch_subprocesses``),
    "http" (SGLang's HTTP launch, marked as ``install_launch_checks`` says), None (unmarked: a launch the plugin
    joined inside, which in 0.5.23 only ``http_server.launch_server`` called directly does, as slime's
    child; an Engine loads plugins in ``__init__``, before anything else).
    installed: the process kinds whose patches are in (``adapter.install``: "server", "child").
    """

    kind: Optional[str] = None
    installed: Set[str] = field(default_factory=set)

    @property
    def http(self) -> bool:
        """Whether a refused launch exits with the message (an HTTP server) or raises it (an Engine)."""
        return self.kind != "engine"


launch = Launch()


def begin_launch(kind: str) -> None:
    if kind not in LAUNCH_KINDS:
        raise ValueError(f"launch kind {kind!r} is not one of {LAUNCH_KINDS}")
    launch.kind = kind


_checking: set = set()  # ids of records whose check_supported is running (it calls resolve_once itself)


@dataclass(frozen=True)
class Missing:
    flag: str  # what to add, as it is typed
    reason: str


class MissingSettingsError(ValueError):
    """The launch lacks a setting capture needs; one line per flag to add."""

    def __init__(self, missing: Sequence[Missing]):
        self.missing = list(missing)
        lines = [f"sglang-r3 ({settings.ENABLED}=1) refuses to start: this launch lacks "
                 + ("a setting" if len(self.missing) == 1 else "settings") + " routing capture needs:"]
        lines += [f"  {m.flag}: {m.reason}" for m in self.missing]
        lines.append(f"Add the flag(s) above (`python -m sglang_r3.launch_server` adds them itself), "
                     f"or unset {settings.ENABLED} to run SGLang without routing capture.")
        super().__init__("\n".join(lines))

    @property
    def flags(self) -> List[str]:
        return [m.flag for m in self.missing]


def on_cpu_runtime() -> bool:
    return settings.current().cpu  # published by cpu.activate_cpu_runtime


# -- what capture needs (settings.CAPTURE_NEEDS) ---------------------------------------------------


def missing_settings(cfg, current: Optional[settings.Settings] = None) -> List[Missing]:
    """Settings the resolved configuration ``cfg`` lacks. Nothing is added behind the caller's back:
    under ``http_server.launch_server(ServerArgs)`` the record is resolved before any plugin runs, so
    the only honest answer on every path is to name what to pass."""
    try:
        current = current or settings.current()
    except settings.SettingsError as err:  # our own variable first: what the rest means depends on it
        return [Missing(f"{err.name} (environment variable)",
                        f"must be {err.expected}, got {err.value!r}; it says {settings.MEANING[err.name]}")]
    out: List[Missing] = []
    for need in settings.CAPTURE_NEEDS:
        if need.when != settings.ALWAYS and not current.cpu:  # the CPU runtime's needs
            continue
        if need.met(cfg):
            continue
        if need.when == settings.ON_CPU_HYBRID_SWA and not _hybrid_swa_pool(cfg):  # reads the model config
            continue
        out.append(Missing(need.flag, need.why(cfg)))
    return out


def _hybrid_swa_pool(cfg) -> bool:
    """Whether SGLang would give this model's sliding-window layers a KV pool of their own."""
    from sglang_r3.seam.release import model_config_of

    return bool(model_config_of(cfg).is_hybrid_swa)


# -- the hooks ----------------------------------------------------------------------------------


_NOTE = f"({settings.ENABLED}=1 turned routing capture on for this SGLang launch; unset it to run SGLang without.)"


def _refuse(err: Exception) -> None:
    # check_supported's message ends "serve with plain `python -m sglang.launch_server`": say how here.
    note = "" if isinstance(err, MissingSettingsError) else _NOTE
    if launch.http:
        raise SystemExit("\n".join(filter(None, (str(err), note)))) from None  # stderr, status 1, no traceback
    if note:
        err.add_note(note)
    raise err


def refuse_unsupported_once_resolved(original, self, *args, **kwargs):
    """Around SGLang's resolution of a ServerArgs record (0.5.23 ``resolve_once``, 0.5.15 ``__post_init__``):
    the raw pass, the resolution itself, the resolved pass."""
    from sglang_r3.seam import release

    if release.resolution_finished(self) or id(self) in _checking:
        return original(self, *args, **kwargs)
    from sglang_r3.serving.refusals.startup import UnsupportedConfigError, check_supported

    _checking.add(id(self))
    if launch.kind is None and release.engine_resolves_args_in_init() and release.constructing_engine():
        launch.kind = "engine"  # this Engine's own hooks came in with its load_plugins(): too late to mark it
    try:
        if on_cpu_runtime() and self.device != "cpu":
            # SGLang may have picked its platform when it was imported, before this plugin prepared the
            # CPU runtime (python -m sglang.launch_server does); left to find the device itself, its
            # resolution then fails with "No accelerator".
            raise MissingSettingsError([Missing(_DEVICE.flag, _DEVICE.why(self))])
        check_supported(self, resolve=lambda: original(self, *args, **kwargs))
    except (UnsupportedConfigError, MissingSettingsError) as err:
        _refuse(err)
    finally:
        _checking.discard(id(self))
    return None


def refuse_unsupported_before_sglangs_checks(self, *args, **kwargs):
    from sglang_r3.seam import release
    from sglang_r3.seam.hooks import HookTargetError, check_uses, verify_applied
    from sglang_r3.serving.refusals.startup import UnsupportedConfigError, check_supported

    try:
        check_uses()  # this is the launching process: the names our routes and launch path call
        verify_applied()
        check_supported(self)  # idempotent; the only check when SGLang resolved before plugins loaded
        missing = missing_settings(release.resolved(self))
        if missing:
            raise MissingSettingsError(missing)
        if on_cpu_runtime():
            from sglang_r3.dev.cpu import bind_rank_threads

            bind_rank_threads(release.cpu_rank_count(self))  # before SGLang spawns a scheduler
    except (HookTargetError, UnsupportedConfigError, MissingSettingsError) as err:
        _refuse(err)
    if launch.http:
        from sglang_r3.serving.adapter.http import install_http_routes

        install_http_routes()  # before _setup_and_run_http_server builds the server on this app
    return None


_DEVICE = settings.NEEDS_BY_FLAG["--device"]


def _marking(kind: str):
    """An AROUND hook: the launch inside ``original`` is of ``kind``, unless an outer entry said already."""
    def around(original, *args, **kwargs):
        before = launch.kind
        if before is None:
            launch.kind = kind
        try:
            return original(*args, **kwargs)
        finally:
            launch.kind = before

    return around


@functools.cache  # once per process, whichever process kinds install it
def install_launch_checks() -> None:
    from sglang_r3.seam import release

    register(release.resolution_target(), refuse_unsupported_once_resolved, "around")
    register("sglang.srt.server_args.ServerArgs.check_server_args", refuse_unsupported_before_sglangs_checks, "before")
    # Which launch is this? `python -m sglang.launch_server` runs that module as __main__ (unhookable, and
    # it resolves the record before it calls anything we hook): an HTTP launch from the start.
    if getattr(getattr(sys.modules.get("__main__"), "__spec__", None), "name", None) == "sglang.launch_server":
        begin_launch("http")
    register("sglang.launch_server.run_server", _marking("http"), "around")  # `sglang serve`
    # An in-process sglang.Engine (its __init__ loads plugins first); an HTTP launch, marked above, goes
    # through it too and stays HTTP.
    register("sglang.srt.entrypoints.engine.Engine._launch_subprocesses", _marking("engine"), "around")
    if release.engine_resolves_args_in_init():  # 0.5.15: in __init__, before _launch_subprocesses
        register("sglang.srt.entrypoints.engine.Engine.__init__", _marking("engine"), "around")
