"""Mount the rollout API (``server.routes``) on SGLang 0.5.23's FastAPI app.

Our ``/generate`` must win over SGLang's, so SGLang's route is removed and
ours inserted at the same place; every other SGLang route stays as it is.
"""

from __future__ import annotations


def install_http_routes() -> None:
    from sglang.srt.entrypoints import http_server

    from server.routes import router

    app = http_server.app
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
