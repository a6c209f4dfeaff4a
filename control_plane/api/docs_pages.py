"""The API's documentation pages, Swagger UI (/docs) and ReDoc (/redoc), offline.

FastAPI's own pages load their JavaScript and CSS from a CDN, so on a network without
internet /docs is a blank page. The assets come from the `fastapi-offline` package
instead (swagger-ui-bundle.js, swagger-ui.css, redoc.standalone.js; see
docs/dependencies.md), served under /docs-assets by this process. Nothing on either
page names another host: ReDoc's Google Fonts link is left out too.
"""

from __future__ import annotations

from importlib.resources import files
from typing import Final

from fastapi import FastAPI
from fastapi.openapi.docs import (
    get_redoc_html,
    get_swagger_ui_html,
    get_swagger_ui_oauth2_redirect_html,
)
from fastapi.staticfiles import StaticFiles
from starlette.requests import Request
from starlette.responses import HTMLResponse

ASSETS_URL: Final = "/docs-assets"
DOCS_URL: Final = "/docs"
REDOC_URL: Final = "/redoc"
OAUTH2_REDIRECT_URL: Final = "/docs/oauth2-redirect"


def assets_directory() -> str:
    """The folder of the bundled Swagger UI and ReDoc files (in the installed package)."""
    return str(files("fastapi_offline").joinpath("static"))


def install_docs(app: FastAPI, openapi_url: str = "/openapi.json") -> None:
    """/docs, /redoc and their assets on `app` (created with docs_url=redoc_url=None)."""
    app.mount(ASSETS_URL, StaticFiles(directory=assets_directory()), name="docs-assets")

    def asset(request: Request, name: str) -> str:
        return f"{request.scope.get('root_path', '')}{ASSETS_URL}/{name}"

    @app.get(DOCS_URL, include_in_schema=False)
    def swagger_ui(request: Request) -> HTMLResponse:
        root = request.scope.get("root_path", "")
        return get_swagger_ui_html(
            openapi_url=f"{root}{openapi_url}", title=f"{app.title} - Swagger UI",
            oauth2_redirect_url=f"{root}{OAUTH2_REDIRECT_URL}",
            swagger_js_url=asset(request, "swagger-ui-bundle.js"),
            swagger_css_url=asset(request, "swagger-ui.css"),
            swagger_favicon_url=asset(request, "favicon.png"),
            swagger_ui_parameters=app.swagger_ui_parameters)

    @app.get(OAUTH2_REDIRECT_URL, include_in_schema=False)
    def swagger_ui_redirect() -> HTMLResponse:
        return get_swagger_ui_oauth2_redirect_html()

    @app.get(REDOC_URL, include_in_schema=False)
    def redoc(request: Request) -> HTMLResponse:
        root = request.scope.get("root_path", "")
        return get_redoc_html(
            openapi_url=f"{root}{openapi_url}", title=f"{app.title} - ReDoc",
            redoc_js_url=asset(request, "redoc.standalone.js"),
            redoc_favicon_url=asset(request, "favicon.png"), with_google_fonts=False)
