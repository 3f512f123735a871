"""
Encoding of server frames: positional rows, and frame text built once per payload.

A commit's ops for one shared query are JSON-encoded once; each subscriber's
frame is that text wrapped with its own queryId, epoch and seq, so fan-out to many
subscribers costs a string format each, not an encode.
"""

import json

from ..exceptions import FRAME_ERROR, FRAME_QUERY_ERROR, RindleError, to_frame
from ..ivm.compare import COMPARATOR_VERSION
from ..ivm.normalized import normalized_fp, normalized_table_schemas

# The websocket subprotocol of the rindle clients. In affinity mode @rindle/remote
# offers it (with an ``aff.*`` placement ticket): a browser closes a socket whose
# handshake does not select one of the subprotocols it offered, so it is selected
# whenever offered. A ticket is never selected: this server mints none, and the
# client leases ticketless once its wait for one times out.
SUBPROTOCOL = "rindle.v1"


def subprotocol(scope):
    """The subprotocol to select in the handshake of ``scope`` (None: offer none)."""
    return SUBPROTOCOL if SUBPROTOCOL in (scope.get("subprotocols") or ()) else None


def dumps(value):
    return json.dumps(value, separators=(",", ":"), ensure_ascii=False, allow_nan=False)


class NormalizedShape:
    """The normalized hello of one query and the positional encoding of its rows."""

    def __init__(self, query, schema):
        self.tables = normalized_table_schemas(query, schema)
        self.fp = normalized_fp(self.tables)
        self.columns = {t["name"]: t["columns"] for t in self.tables}
        self.json_columns = {}
        for t in self.tables:
            table = schema.get(t["name"]) if t["name"] in schema else None
            if table is not None:
                self.json_columns[t["name"]] = {c.name for c in table.columns if c.type == "json"}
        self.tables_json = dumps(self.tables)

    def cells(self, table, row):
        columns = self.columns[table]
        json_columns = self.json_columns.get(table)
        if not json_columns:
            return [row.get(c) for c in columns]
        return [_json_cell(row.get(c)) if c in json_columns else row.get(c) for c in columns]

    def ops(self, ops):
        """View ops (rows as dicts) as wire ops (rows positional)."""
        out = []
        for op in ops:
            table = op["table"]
            if op["op"] == "edit":
                out.append(
                    {
                        "table": table,
                        "op": "edit",
                        "old": self.cells(table, op["old"]),
                        "new": self.cells(table, op["new"]),
                    }
                )
            else:
                out.append({"table": table, "op": op["op"], "row": self.cells(table, op["row"])})
        return out


def _json_cell(value):
    # JSON columns travel as their raw JSON text.
    if value is None or isinstance(value, str):
        return value
    return dumps(value)


def nhello(query_id, epoch, shape, boot_id):
    return (
        f'{{"t":"nhello","queryId":{query_id},"hello":{{"epoch":{epoch},'
        f'"comparatorVersion":{COMPARATOR_VERSION},"tables":{shape.tables_json},'
        f'"normalizedFp":"{shape.fp}"}},"bootId":{dumps(boot_id)}}}'
    )


def nbatch(query_id, epoch, seq, fp, ops_json, cv):
    return (
        f'{{"t":"nbatch","queryId":{query_id},"batch":{{"epoch":{epoch},"seq":{seq},'
        f'"normalizedFp":"{fp}","ops":{ops_json},"cv":{cv}}}}}'
    )


def hello(query_id, hello_json, boot_id):
    return f'{{"t":"hello","queryId":{query_id},"hello":{hello_json},"bootId":{dumps(boot_id)}}}'


def batch(query_id, epoch, seq, fp, events_json, cv):
    return (
        f'{{"t":"batch","queryId":{query_id},"batch":{{"epoch":{epoch},"seq":{seq},'
        f'"schemaFp":"{fp}","events":{events_json},"cv":{cv}}}}}'
    )


def progress(cv):
    return f'{{"t":"progress","frame":{{"cvMin":{cv}}}}}'


class QueryErrorFrame(str):
    """
    The text of a ``queryError`` frame, typed as one where it is built: a connection
    the hub sheds still gets the query errors it was due (``Hub._deliver``), and the
    hub tells them from data frames by this type, never by searching the text.
    """

    __slots__ = ()


def query_error(query_id, message, code, retryable=False, retry_after_ms=None):
    """A ``queryError`` frame of ``code`` (``rindle_app.exceptions.to_frame``)."""
    exc = RindleError(message, code=code)
    return QueryErrorFrame(
        to_frame(
            exc,
            query_id,
            kind=FRAME_QUERY_ERROR,
            retryable=retryable,
            retry_after_ms=retry_after_ms,
        )
    )


def error(message, code, query_id=None, **extra):
    """An ``error`` frame of ``code`` (``rindle_app.exceptions.to_frame``)."""
    return to_frame(RindleError(message, code=code), query_id, kind=FRAME_ERROR, **extra)
