"""
Every error of the HTTP API as ``{"error": {"code", "message", ...}}``, with its
status, decided here and nowhere else.
"""

import logging

from rest_framework import exceptions
from rest_framework.response import Response
from rest_framework.views import exception_handler as drf_exception_handler

from ..engine.errors import MutationGap, RindleError, Unavailable
from ..ivm.ast import QueryError
from ..named import QueryRefused

logger = logging.getLogger("rindle.api")

QUERY_REFUSED_STATUS = {
    "unknown_query": 404,
    "invalid_args": 400,
    "unauthorized": 403,
    "internal_error": 500,  # a named query's own code failed (logged): still an envelope
}
RETRY_AFTER_SECONDS = 1


def error_response(status, code, message, headers=None, **details):
    return Response(
        {"error": {"code": code, "message": message, **details}}, status=status, headers=headers
    )


def exception_handler(exc, context):
    """The response of ``exc`` raised in a rindle view; None re-raises it (a 500)."""
    if isinstance(exc, QueryRefused):
        return error_response(QUERY_REFUSED_STATUS.get(exc.code, 400), exc.code, exc.message)
    if isinstance(exc, MutationGap):
        # The clients recognise a gap by the words "mutation gap" in the error.
        message = f"mutation gap: {exc.message}"
        return error_response(exc.status, exc.code, message, lmid=exc.lmid)
    if isinstance(exc, Unavailable):
        headers = {"Retry-After": str(RETRY_AFTER_SECONDS)}
        return error_response(exc.status, exc.code, exc.message, headers, retryable=True)
    if isinstance(exc, RindleError):
        details = {
            k: v for k, v in exc.details.items() if k not in ("code", "message") and v is not None
        }
        return error_response(exc.status, exc.code, exc.message, retryable=exc.retryable, **details)
    if isinstance(exc, QueryError):
        # The named query's own definition is wrong: a server bug, not the caller's.
        logger.error("rindle api: a named query built an unusable query: %s", exc)
        return error_response(500, exc.code, str(exc))
    response = drf_exception_handler(exc, context)
    if response is None:
        return None
    response.data = {"error": {"code": _code(exc), "message": _message(response.data)}}
    return response


def _code(exc):
    if isinstance(exc, exceptions.ValidationError):
        return "invalid_request"
    if isinstance(exc, exceptions.APIException):
        codes = exc.get_codes()
        return codes if isinstance(codes, str) else exc.default_code
    return "error"


def _message(data):
    if isinstance(data, dict) and set(data) == {"detail"}:
        return str(data["detail"])
    return _flatten(data)


def _flatten(detail, path=""):
    if isinstance(detail, dict):
        return "; ".join(_flatten(v, f"{path}.{k}" if path else str(k)) for k, v in detail.items())
    if isinstance(detail, list):
        if all(not isinstance(d, (dict, list)) for d in detail):
            text = " ".join(str(d) for d in detail)
            return f"{path}: {text}" if path else text
        return "; ".join(_flatten(d, f"{path}[{i}]") for i, d in enumerate(detail) if d)
    return f"{path}: {detail}" if path else str(detail)
