"""
The DRF exception handler of rindle's views: a ``RindleError`` is answered by
``rindle_app.exceptions.to_response``, any other DRF error in the same envelope
``{"error": {"code", "message"}}``. A body that fails a serializer (DRF's
``ValidationError``) is a 400 ``invalid_request`` whose ``details`` are DRF's
field-error object (``{"envelope": {"mid": ["A valid integer is required."]}}``);
``message`` is the same errors in one line.
"""

import logging

from rest_framework import exceptions
from rest_framework.settings import api_settings
from rest_framework.views import exception_handler as drf_exception_handler

from ..engine.mutations import flatten_errors
from ..exceptions import ERROR, INVALID_REQUEST, QueryError, RindleError, to_response

logger = logging.getLogger("rindle.api")


def exception_handler(exc, context):
    """The response of ``exc`` raised in a rindle view; None re-raises it (a 500)."""
    if isinstance(exc, QueryError):
        # The named query's own definition is wrong: a server bug, not the caller's.
        logger.error("rindle api: a named query built an unusable query: %s", exc)
    if isinstance(exc, RindleError):
        return to_response(exc)
    response = drf_exception_handler(exc, context)
    if response is None:
        return None
    error = {"code": _code(exc), "message": _message(response.data)}
    if isinstance(exc, exceptions.ValidationError):
        data = response.data
        if not isinstance(data, dict):
            data = {api_settings.NON_FIELD_ERRORS_KEY: data}
        error["details"] = data
    response.data = {"error": error}
    return response


def _code(exc):
    if isinstance(exc, exceptions.ValidationError):
        return INVALID_REQUEST
    if isinstance(exc, exceptions.APIException):
        codes = exc.get_codes()
        return codes if isinstance(codes, str) else exc.default_code
    return ERROR


def _message(data):
    if isinstance(data, dict) and set(data) == {"detail"}:
        return str(data["detail"])
    return flatten_errors(data)
