"""Everything that touches SGLang 0.5.23 internals lives in this package.

The next SGLang bump should only need changes here. ``plugin`` is called by the
project's one entry point (``sglang_r3.plugin``, registered under SGLang's
``sglang.srt.plugins`` group), so SGLang calls it in each of its processes,
with the rollout API to mount (the adapter never imports ``server/``); it is inert (registers nothing, changes no environment)
unless ``SGLANG_R3_ENABLED=1``. ``sglang_r3.launch_server`` sets it for its own
children; set by the user, it turns capture on under SGLang's own launchers
(``python -m sglang.launch_server``, ``http_server.launch_server(ServerArgs)``,
``sglang.Engine``; see ``opt_in.py``).
"""

from __future__ import annotations

import os
from typing import Any, Callable, Optional

_installed = set()


def plugin(routes: Optional[Callable[[], Any]] = None) -> None:
    """``routes``: returns the rollout API's router, mounted where an HTTP server is launched."""
    # The launcher process installs its own set ("server") before SGLang loads plugins.
    if os.environ.get("SGLANG_R3_ENABLED") != "1" or "server" in _installed:
        return
    from sglang_r3.patches.hooks import HookTargetError

    # SGLang's loader logs and ignores a plugin's Exception: the process would go on without capture,
    # or with part of it. Start-up stops instead, saying why.
    try:
        _prepare_cpu_runtime()
        install(process="child", routes=routes)
    except HookTargetError as err:
        raise SystemExit(str(err)) from None
    except Exception as err:  # noqa: BLE001 -- any failure to install is a refusal to start
        first = next((line.strip() for line in str(err).splitlines() if line.strip()), "")
        cause = next((line.strip().lstrip("- ") for line in str(err).splitlines() if "libcuda" in line), "")
        raise SystemExit(
            "sglang-r3 refuses to start: installing its SGLang patches (SGLANG_R3_ENABLED=1) failed with "
            f"{type(err).__name__}: {first}" + (f" ({cause})" if cause and cause != first else "")
        ) from None


def _prepare_cpu_runtime() -> None:
    """On a host without a GPU: the libcuda stand-in before any hook target imports sgl-kernel, and
    SGLang's CPU engine for this process's children (the launcher did this already for its own)."""
    if os.environ.get("SGLANG_R3_CPU") == "1":
        return
    from sglang_r3.cpu import activate_cpu_runtime, has_gpu

    if not has_gpu():
        activate_cpu_runtime()


def install(process: str, routes: Optional[Callable[[], Any]] = None) -> None:
    """Every patch this process kind needs. ``routes`` returns the rollout API's router
    (``server.routes.router``), mounted on SGLang's app by whichever process serves HTTP."""
    if process in _installed:
        return
    _installed.add(process)
    from sglang_r3 import metrics
    from sglang_r3.patches import api, http

    metrics.use_probe(api.metrics_enabled)
    if routes is not None:
        http.use_routes(routes)
    if os.environ.get("SGLANG_R3_CPU") == "1":
        from sglang_r3.patches.cpu import install_cpu_patches

        install_cpu_patches()
    # The TokenizerManager lives in the launcher's process for a server and in the caller's for an
    # in-process sglang.Engine: every output leaves through it, in every process kind.
    from sglang_r3.patches.responses import install_response_patches

    install_response_patches()
    # Requests are checked where they enter (the TokenizerManager, whichever process holds it),
    # so a bad field becomes a 400 instead of killing the scheduler.
    from sglang_r3.patches.input_guard import install_input_guard

    install_input_guard()
    if process == "server":
        from sglang_r3.patches.hooks import check_uses, raise_if_missing

        check_uses()
        raise_if_missing()  # before the routes, which are what call those names
        http.install_http_routes()
    else:
        from sglang_r3.patches.capture import install_capture_patches
        from sglang_r3.patches.opt_in import install_launch_checks

        install_capture_patches()
        # Only the launching process calls the two ServerArgs methods these hook (opt_in.py).
        install_launch_checks()
    from sglang_r3.patches.hooks import raise_if_missing

    raise_if_missing()
