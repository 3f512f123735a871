"""
Total JSON parsing for everything a client sends (websocket frames, HTTP bodies).

``loads`` either returns a value every later step can handle, or raises
``BadJSON`` (a ``ValueError``) with a message fit for the client. It refuses what
``json.loads`` lets through and something downstream would then trip over:

- nesting deeper than ``MAX_DEPTH`` (Python's parser raises ``RecursionError``,
  which is not a ``ValueError``, near 1,000 levels, and the code after it recurses
  too: ``copy.deepcopy``, serializers, ``json.dumps``);
- a lone UTF-16 surrogate written as an escape (``"\\ud800"``): the string cannot
  be encoded as UTF-8, so the database, the ledger or the wire would raise later;
- ``NaN``, ``Infinity`` and numbers that overflow to infinity (not JSON, and
  refused by every encoder the server answers with);
- integers outside 64 bits (no database column holds them, and no client can
  have sent one it computed: JavaScript numbers stop at 2**53).
"""

import json
import re

MAX_DEPTH = 128
MAX_INT = 2**63 - 1

# Brackets outside strings: a string token is skipped whole, escapes included.
_TOKEN = re.compile(r'"(?:[^"\\]|\\.)*"|[\[\]{}]', re.DOTALL)
# A surrogate escape; whether it is paired is decided on the parsed value.
_SURROGATE_ESCAPE = re.compile(r"\\u[dD][89abcdefABCDEF]")


class BadJSON(ValueError):
    """The text is not JSON that rindle accepts; the message says why."""


def loads(text):
    """The value of JSON ``text`` (a ``str``), or ``BadJSON``."""
    if not text.isascii():
        try:
            text.encode("utf-8")  # a str handed over in process may hold a raw surrogate
        except UnicodeEncodeError:
            raise BadJSON("the text holds a lone UTF-16 surrogate (not valid Unicode)") from None
    if text.count("[") + text.count("{") > MAX_DEPTH:
        _check_depth(text)
    try:
        value = json.loads(text, parse_constant=_constant, parse_int=_int, parse_float=_float)
    except RecursionError:  # pragma: no cover - the depth check comes first
        raise BadJSON(f"JSON nested deeper than {MAX_DEPTH} levels") from None
    except BadJSON:
        raise
    except ValueError as exc:
        raise BadJSON(f"malformed JSON: {exc}") from None
    if _SURROGATE_ESCAPE.search(text):
        _check_encodable(value)
    return value


def _check_depth(text):
    depth = 0
    for match in _TOKEN.finditer(text):
        token = match.group()
        if token in "[{":
            depth += 1
            if depth > MAX_DEPTH:
                raise BadJSON(f"JSON nested deeper than {MAX_DEPTH} levels")
        elif token in "]}":
            depth -= 1


def _check_encodable(value):
    # Depth is bounded by now, so dumps cannot recurse too far.
    try:
        json.dumps(value, ensure_ascii=False).encode("utf-8")
    except UnicodeEncodeError:
        raise BadJSON("a string holds a lone UTF-16 surrogate (not valid Unicode)") from None


def _constant(name):
    raise BadJSON(f"{name} is not a JSON number")


def _int(digits):
    value = int(digits)
    if not -MAX_INT - 1 <= value <= MAX_INT:
        raise BadJSON(f"integer {digits[:24]}{'…' if len(digits) > 24 else ''} exceeds 64 bits")
    return value


def _float(digits):
    value = float(digits)
    if value in (float("inf"), float("-inf")):
        raise BadJSON(f"number {digits[:24]} is out of range")
    return value
