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
    app.include_router(router)
    app.openapi_schema = None  # rebuild /openapi.json with our routes
