"""The console: a small web UI of the control plane at /console (docs/console.md).

Static HTML, CSS and JavaScript from the keg package (control_plane/api/console/), no
build step and nothing loaded from another host. The pages are public; everything
they show or change goes through the REST API with the token the user signs in with,
so the console can do exactly what that token can.
"""

from __future__ import annotations

from importlib.resources import files
from typing import Final

from fastapi import FastAPI
from fastapi.staticfiles import StaticFiles
from starlette.requests import Request
from starlette.responses import RedirectResponse

CONSOLE_URL: Final = "/console"


def console_directory() -> str:
    return str(files("control_plane.api").joinpath("console"))


def install_console(app: FastAPI) -> None:
    @app.get(CONSOLE_URL, include_in_schema=False)
    def console_root(request: Request) -> RedirectResponse:
        # The pages load their files relative to /console/.
        return RedirectResponse(f"{request.scope.get('root_path', '')}{CONSOLE_URL}/")

    app.mount(f"{CONSOLE_URL}/", StaticFiles(directory=console_directory(), html=True),
              name="console")
