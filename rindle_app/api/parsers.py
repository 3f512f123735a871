"""The JSON parser of rindle's HTTP routes: every body is parsed totally (``strictjson``)."""

from rest_framework.exceptions import ParseError
from rest_framework.parsers import JSONParser, get_encoding

from ..strictjson import BadJSON, loads


class StrictJSONParser(JSONParser):
    """
    DRF's ``JSONParser``, with ``rindle_app.strictjson`` rules: deep nesting, lone
    surrogates, ``NaN``/``Infinity``, out-of-range numbers and bytes that are not
    UTF-8 are a ``ParseError`` (400 ``parse_error``), never a 500.
    """

    def parse(self, stream, media_type=None, parser_context=None):
        encoding = get_encoding(parser_context or {})  # text codecs only
        raw = stream.read() if stream is not None else b""
        try:
            text = raw.decode(encoding)
        except UnicodeDecodeError as exc:
            raise ParseError(f"JSON parse error - the body is not {encoding}: {exc}") from None
        try:
            return loads(text)
        except BadJSON as exc:
            raise ParseError(f"JSON parse error - {exc}") from None
