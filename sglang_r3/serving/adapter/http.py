"""Mount the rollout API on SGLang's FastAPI app: our ``/generate`` replaces SGLang's at the same
place, every other route stays. The entry points hand the router in (``use_routes``), so the adapter
never imports the server above it.
"""

from __future__ import annotations

from typing import Any, Callable, Optional

_routes: Optional[Callable[[], Any]] = None


def use_routes(routes: Callable[[], Any]) -> None:
    """``routes()`` returns the router to mount (called only when an HTTP server is launched)."""
    global _routes
    _routes = routes


def install_http_routes(router: Any = None) -> None:
    from sglang_r3.serving.adapter import api

    if router is None:
        if _routes is None:
            raise RuntimeError("sglang-r3: no rollout API was handed to the adapter (adapter.http.use_routes)")
        router = _routes()
    app = api.app()
    paths = {r.path for r in router.routes}
    routes = app.router.routes
    # Where SGLang's first replaced route stood: Starlette matches routes in order, and /generate appended
    # after SGLang's ~70 routes was matched against every one of them on every request.
    at = next((i for i, r in enumerate(routes) if getattr(r, "path", None) in paths), len(routes))
    routes[:] = [r for r in routes if getattr(r, "path", None) not in paths]
    at = min(at, len(routes))
    before = len(routes)
    # One app-level route per endpoint (not include_router, which this FastAPI wraps in a single
    # router route): SGLang's API-key middleware reads each matched route's endpoint for its
    # @auth_level, and an admin endpoint behind a wrapper would be served without the admin key.
    for r in router.routes:
        app.add_api_route(
            r.path,
            r.endpoint,
            methods=sorted(r.methods),
            response_model=r.response_model,
            responses=r.responses,
            summary=r.summary,
            openapi_extra=r.openapi_extra,
        )
    added = routes[before:]
    del routes[before:]
    routes[at:at] = added
    app.openapi_schema = None  # rebuild /openapi.json with our routes
