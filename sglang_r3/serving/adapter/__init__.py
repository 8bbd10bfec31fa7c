"""The SGLang adapter: the hooks at SGLang's capture sites, PD / DP rows, the outputs' contract, the HTTP mount.
With the seam below it (``sglang_r3/seam/``: the manifest, the hook registry, the releases and how they differ),
the refusals (``serving/refusals/``) and the CPU runtime (``sglang_r3/cpu_runtime/``), the only code that touches
SGLang's internals; the next SGLang bump should only need changes there. ``plugin`` (SGLang's plugin loader
calls it in every SGLang process) is inert unless ``settings.current().enabled``; ``opt_in.launch`` says which
launch this process is part of.
"""

from __future__ import annotations

from typing import Any, Callable, Optional

from sglang_r3.core import settings


def plugin(routes: Optional[Callable[[], Any]] = None) -> None:
    """``routes``: returns the rollout API's router, mounted where an HTTP server is launched."""
    try:
        enabled = settings.current().enabled
    except settings.SettingsError as err:  # named before SGLang goes on without (or with half) capture
        raise SystemExit(f"sglang-r3 refuses to start: {err}") from None
    if not enabled:
        return
    from sglang_r3.seam.hooks import HookTargetError
    from sglang_r3.serving.adapter.opt_in import launch
    from sglang_r3.seam.release import UnsupportedRelease

    if launch.kind == "server":  # our launcher installed its own set already
        return

    # SGLang's loader logs and ignores a plugin's Exception: the process would go on without capture,
    # or with part of it. Start-up stops instead, saying why.
    try:
        _prepare_cpu_runtime()
        install(process="child", routes=routes)
    except (HookTargetError, UnsupportedRelease) as err:
        raise SystemExit(str(err)) from None
    except Exception as err:  # noqa: BLE001 -- any failure to install is a refusal to start
        first = next((line.strip() for line in str(err).splitlines() if line.strip()), "")
        cause = next((line.strip().lstrip("- ") for line in str(err).splitlines() if "libcuda" in line), "")
        raise SystemExit(
            f"sglang-r3 refuses to start: installing its SGLang patches ({settings.ENABLED}=1) failed with "
            f"{type(err).__name__}: {first}" + (f" ({cause})" if cause and cause != first else "")
        ) from None


def _prepare_cpu_runtime() -> None:
    """On a host without a GPU: the libcuda stand-in before any hook target imports sgl-kernel, and
    SGLang's CPU engine for this process's children (the launcher did this already for its own)."""
    if settings.current().cpu:
        return
    from sglang_r3.dev.cpu import activate_cpu_runtime, has_gpu

    if not has_gpu():
        activate_cpu_runtime()


def install(process: str, routes: Optional[Callable[[], Any]] = None) -> None:
    """Every patch this process kind needs. ``routes`` returns the rollout API's router
    (``sglang_r3_server.routes.router``), mounted on SGLang's app by whichever process serves HTTP."""
    from sglang_r3.serving.adapter.opt_in import launch

    if process in launch.installed:
        return
    from sglang_r3.seam.release import current

    current()  # a release outside the window stops here, naming it and what differs
    launch.installed.add(process)
    from sglang_r3.serving import metrics
    from sglang_r3.serving.adapter import api, http

    metrics.use_probe(api.metrics_enabled)
    if routes is not None:
        http.use_routes(routes)
    if settings.current().cpu:
        from sglang_r3.cpu_runtime import install_cpu_patches

        install_cpu_patches()
    # The TokenizerManager lives in the launcher's process for a server and in the caller's for an
    # in-process sglang.Engine: every output leaves through it, in every process kind.
    from sglang_r3.serving.adapter.outputs import install_response_patches

    install_response_patches()
    # Requests are checked where they enter (the TokenizerManager, whichever process holds it),
    # so a bad field becomes a 400 instead of killing the scheduler.
    from sglang_r3.serving.refusals.input_guard import install_input_guard

    install_input_guard()
    if process == "server":
        from sglang_r3.seam.hooks import check_uses, raise_if_missing

        check_uses()
        raise_if_missing()  # before the routes, which are what call those names
        http.install_http_routes()
    else:
        from sglang_r3.serving.adapter.capture_site import install_capture_patches
        from sglang_r3.serving.adapter.opt_in import install_launch_checks

        install_capture_patches()
        # Only the launching process calls the two ServerArgs methods these hook (opt_in.py).
        install_launch_checks()
    from sglang_r3.seam.hooks import raise_if_missing

    raise_if_missing()
