"""Mount the rollout API (``server.routes``) on SGLang 0.5.23's FastAPI app.

Our ``/generate`` must win over SGLang's, so SGLang's route is removed and
ours inserted at the same place; every other SGLang route stays as it is.
"""

from __future__ import annotations


def install_http_routes() -> None:
    from sglang.srt.entrypoints import http_server

    from server.routes import router

    app = http_server.app
    ours = {(r.path, frozenset(getattr(r, "methods", ()) or ())) for r in router.routes}
    paths = {p for p, _ in ours}
    app.router.routes[:] = [r for r in app.router.routes if getattr(r, "path", None) not in paths]
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
    app.openapi_schema = None  # rebuild /openapi.json with our routes
