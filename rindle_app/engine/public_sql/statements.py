"""
Public SQL statements: values, scanning, parsing and identity. Their error,
``SqlError``, lives in ``rindle_app.exceptions`` (imported from here too).
"""

import hashlib
import json
import math
import re
import uuid
from dataclasses import dataclass
from datetime import date, datetime
from datetime import time as dtime
from decimal import Decimal

from ...conf import rindle_settings
from ...exceptions import (
    SQL_DDL_FORBIDDEN,
    SQL_PROTOCOL_ERROR,
    SQL_STATEMENT_UNSUPPORTED,
    SQL_VALUE_UNSUPPORTED,
    SqlError,
)
from .. import sql_text

I64_MIN, I64_MAX = -(2**63), 2**63 - 1
SAFE_INT = 2**53 - 1
RETRY_SCOPES = ("request", "transaction", "closure", "never")


def protocol_error(message, index=None):
    return SqlError(message, code=SQL_PROTOCOL_ERROR, statement_index=index)


# --- values ----------------------------------------------------------------------------


def decode_value(value, where):
    """A JSON argument as a driver value; tagged values carry what JSON cannot."""
    if value is None or isinstance(value, str):
        return value
    if isinstance(value, bool):
        return int(value)
    if isinstance(value, int):
        if not I64_MIN <= value <= I64_MAX:
            raise _unsupported(f"{where}: {value} is outside the 64-bit integer range")
        return value
    if isinstance(value, float):
        return value
    if isinstance(value, dict) and set(value) == {"$rindle", "value"}:
        tag, text = value["$rindle"], value["value"]
        if tag == "i64" and isinstance(text, str) and re.fullmatch(r"-?[0-9]{1,19}", text):
            number = int(text)
            if I64_MIN <= number <= I64_MAX:
                return number
        if tag == "float" and isinstance(text, str):
            try:
                return float(text)
            except ValueError:
                pass
    raise _unsupported(f"{where}: unsupported value {json.dumps(value)[:80]}")


def _unsupported(message):
    return SqlError(message, code=SQL_VALUE_UNSUPPORTED)


def encode_value(value):
    """A database value as JSON: big integers and non-finite floats tagged."""
    if value is None or isinstance(value, str):
        return value
    if isinstance(value, bool):
        return int(value)
    if isinstance(value, int):
        return value if -SAFE_INT <= value <= SAFE_INT else {"$rindle": "i64", "value": str(value)}
    if isinstance(value, float):
        if math.isfinite(value):
            return value
        text = "NaN" if math.isnan(value) else ("Infinity" if value > 0 else "-Infinity")
        return {"$rindle": "float", "value": text}
    if isinstance(value, Decimal):
        if value.is_finite() and value == value.to_integral_value():
            return encode_value(int(value))
        return encode_value(float(value))
    if isinstance(value, (datetime, date, dtime)):
        return value.isoformat()
    if isinstance(value, uuid.UUID):
        return str(value)
    if isinstance(value, (dict, list)):
        return json.dumps(value, separators=(",", ":"))
    raise _unsupported(f"a result value of type {type(value).__name__} has no JSON form")


# --- statements ------------------------------------------------------------------------

READS = {"SELECT", "VALUES", "WITH", "TABLE"}
WRITES = {"INSERT", "UPDATE", "DELETE", "REPLACE", "MERGE"}
DDL = {
    "CREATE",
    "ALTER",
    "DROP",
    "TRUNCATE",
    "RENAME",
    "COMMENT",
    "GRANT",
    "REVOKE",
    "REINDEX",
    "CLUSTER",
    "REFRESH",
    "SECURITY",
    "IMPORT",
}


_ONE_PER_ENTRY = "send one statement per entry (text follows a ';')"


@dataclass
class Statement:
    """One validated statement: its text, driver text, decoded args and identity."""

    index: int
    sql: str
    args: object  # list, dict or None, decoded
    want_rows: bool
    keyword: str
    driver_sql: str
    wire: dict  # as sent, for the request identity
    size: int


def parse_statements(items, vendor, *, many=True):
    """Validate ``items`` (a list of statements; one statement when not ``many``)."""
    if not many:
        return [parse_statement(items, 0, vendor)]
    if not isinstance(items, list) or not items:
        raise protocol_error("statements must be a non-empty list")
    limit = int(rindle_settings.SQL_MAX_STATEMENTS)
    if len(items) > limit:
        raise protocol_error(f"{len(items)} statements; the limit is {limit}")
    return [parse_statement(item, i, vendor) for i, item in enumerate(items)]


def parse_statement(item, index, vendor):
    if isinstance(item, str):
        item = {"sql": item}
    if not isinstance(item, dict):
        raise protocol_error("a statement is an object {sql, args?, want_rows?}", index)
    unknown = set(item) - {"sql", "args", "want_rows"}
    if unknown:
        raise protocol_error(f"unknown statement field(s) {sorted(unknown)}", index)
    sql = item.get("sql")
    if not isinstance(sql, str) or not sql.strip():
        raise protocol_error("sql must be a non-empty string", index)
    size = len(sql.encode())
    limit = int(rindle_settings.SQL_MAX_STATEMENT_BYTES)
    if size > limit:
        raise protocol_error(f"the statement takes {size} bytes; the limit is {limit}", index)
    if "\x00" in sql:
        raise protocol_error("sql contains a NUL character", index)
    want_rows = item.get("want_rows", True)
    if not isinstance(want_rows, bool):
        raise protocol_error("want_rows must be a boolean", index)
    raw_args = item.get("args")
    try:
        keyword, positional, names, driver_sql = scan(sql, vendor)
        args = _bind(raw_args, positional, names)
    except SqlError as exc:
        raise exc.at(index) from None
    _check_keyword(keyword, index)
    wire = {"sql": sql, "args": raw_args, "want_rows": want_rows}
    size += len(json.dumps(raw_args))
    return Statement(index, sql, args, want_rows, keyword, driver_sql, wire, size)


def _bind(raw, positional, names):
    if positional and names:
        raise protocol_error("use either ? or :name placeholders in one statement, not both")
    if names:
        if not isinstance(raw, dict):
            raise protocol_error("named placeholders take args as an object")
        missing = sorted(set(names) - set(raw))
        extra = sorted(set(raw) - set(names))
        if missing or extra:
            raise protocol_error(
                f"args do not match the placeholders: missing {missing}, extra {extra}"
            )
        return {k: decode_value(v, f"args.{k}") for k, v in raw.items()}
    if raw is None:
        raw = []
    if not isinstance(raw, list):
        raise protocol_error("positional placeholders take args as a list")
    if len(raw) != positional:
        raise protocol_error(f"the statement has {positional} placeholder(s) but {len(raw)} args")
    return [decode_value(v, f"args[{i}]") for i, v in enumerate(raw)] or None


def _check_keyword(keyword, index):
    if keyword is None:
        raise protocol_error("the statement is empty", index)
    if keyword in READS or keyword in WRITES:
        return
    if keyword in DDL:
        raise SqlError(
            f"{keyword} is DDL: apply schema changes through /v1/sql/migrate",
            code=SQL_DDL_FORBIDDEN,
            statement_index=index,
        )
    raise SqlError(
        f"{keyword} statements are not accepted here (only SELECT, VALUES, WITH, INSERT, "
        "UPDATE, DELETE)",
        code=SQL_STATEMENT_UNSUPPORTED,
        statement_index=index,
    )


def scan(sql, vendor):
    """
    ``(first keyword, ? count, :names, driver text)`` of one statement.

    ``sql_text`` reads it in the backend's dialect, so a placeholder or a ``;``
    inside a string, quoted identifier, dollar quote or comment counts for nothing.
    Only whitespace and comments may follow a top-level ``;``. On PostgreSQL the
    driver text uses psycopg's ``%s``/``%(name)s`` (a literal ``%`` doubled).
    """
    pg = vendor == "postgresql"
    out, keyword, positional, names, ended, colon = [], None, 0, [], False, None
    try:
        for t in sql_text.lex(sql, sql_text.POSTGRESQL if pg else sql_text.SQLITE):
            text, after_colon, colon = t.text, colon, None
            if t.kind in sql_text.SKIPPED:
                pass
            elif ended:
                raise protocol_error(_ONE_PER_ENTRY)
            elif t.kind == ";":
                ended = True
                continue
            elif t.kind == "param":
                raise protocol_error("use ? or :name placeholders, not $n")
            elif text == "?":
                positional += 1
                text = "%s" if pg else "?"
            elif text == ":" and (t.start == 0 or sql[t.start - 1] != ":"):
                colon = t
            elif t.kind == "word" and after_colon and not (pg and "$" in text):
                names.append(text)
                out[-1] = ""
                text = f"%({text})s" if pg else ":" + text
            elif t.kind in ("word", "estring"):
                keyword = keyword or (text.upper() if t.kind == "word" else text[0].upper())
            elif text == "%" and pg:
                text = "%%"
            out.append(text)
    except sql_text.SqlTextError as exc:
        # After a ';' only a comment's own error outranks "one statement per entry".
        comment = sql.startswith("/*", exc.at)
        raise protocol_error(exc.message if comment or not ended else _ONE_PER_ENTRY) from None
    names = list(dict.fromkeys(names))
    driver = "".join(out) if pg and (positional or names) else sql.rstrip().rstrip(";")
    return keyword, positional, names, driver


def identity(route, statements):
    """The request identity: what a replay must repeat exactly."""
    text = json.dumps(
        {"route": route, "statements": [s.wire for s in statements]},
        sort_keys=True,
        separators=(",", ":"),
    )
    return hashlib.sha256(text.encode()).hexdigest()
