"""The named queries a websocket subscriber of the schema-change tests uses."""

from rindle_app.ivm.builder import table
from rindle_app.named import named_query


@named_query("schemaNotes")
def schema_notes(args, ctx):
    return table("schema_app_note")
