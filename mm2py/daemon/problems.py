"""One error model for every answer of the REST listener: `Problem`, Kafka Connect's body.

Routers raise `ApiProblem(status, message)`; `install` makes the app answer it, and every
error Starlette raises itself (an unknown path, a method a path does not serve), with
`Problem` (mm2py.runtime.status: `{"error_code", "message"}`, Connect's ErrorMessage), on
mm2py's API and Connect's alike. Starlette's own errors are worded as Jersey words them
for Connect (`HTTP 404 Not Found`), and a 405's Allow names every method that any of the
app's routers serves on the path.
"""

from __future__ import annotations

from collections.abc import Sequence
from http import HTTPStatus
from typing import Any

from fastapi import APIRouter, FastAPI, Request
from fastapi.responses import JSONResponse, Response
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.routing import BaseRoute, Match

from mm2py.runtime.status import Problem

# OpenAPI `responses` entries for the routers' errors.
ERROR: dict[str, Any] = {"model": Problem}


class ApiProblem(Exception):
    """An error answer: `status` with `Problem`'s body."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status
        self.message = message


def install(app: FastAPI, routers: Sequence[APIRouter]) -> None:
    """Answer `ApiProblem` and Starlette's errors with `Problem` on `app`, which serves
    `routers` (a 405's Allow looks into them)."""
    app.state.routers = tuple(routers)
    app.add_exception_handler(ApiProblem, answer_problem)  # type: ignore[arg-type]
    app.add_exception_handler(StarletteHTTPException, answer_http_error)  # type: ignore[arg-type]


def problem_response(status: int, message: str, headers: dict[str, str] | None = None) -> Response:
    return JSONResponse(Problem(error_code=status, message=message).model_dump(), status, headers)


def answer_problem(_request: Request, exc: ApiProblem) -> Response:
    return problem_response(exc.status, exc.message)


def answer_http_error(request: Request, exc: StarletteHTTPException) -> Response:
    # Unknown paths and methods, as Jersey words them for Connect.
    detail = exc.detail if exc.detail and exc.detail != _phrase(exc.status_code) else None
    headers = dict(exc.headers or {})
    if exc.status_code == 405:
        # Starlette names the methods of the first route of the path only, and FastAPI
        # wraps an included router's routes in one route of its own.
        routers: Sequence[APIRouter] = request.app.state.routers
        routes = [*request.app.routes, *(r for router in routers for r in router.routes)]
        headers["Allow"] = ", ".join(allowed_methods(request, routes))
    return problem_response(exc.status_code, detail or status_line(exc.status_code), headers)


def allowed_methods(request: Request, routes: Sequence[BaseRoute]) -> list[str]:
    """Every method one of `routes` serves on the request's path."""
    methods: set[str] = set()
    scope = {**request.scope, "method": "GET"}
    for route in routes:
        route_methods = getattr(route, "methods", None)
        if route_methods and route.matches(scope)[0] != Match.NONE:
            methods.update(route_methods)
    return sorted(methods)


def status_line(code: int) -> str:
    """Jersey's words for an error status, as Connect answers them: `HTTP 404 Not Found`."""
    phrase = _phrase(code)
    return f"HTTP {code} {phrase}" if phrase else f"HTTP {code}"


def _phrase(code: int) -> str:
    try:
        return HTTPStatus(code).phrase
    except ValueError:
        return ""
