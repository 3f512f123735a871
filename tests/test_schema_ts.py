"""rindle_schema_ts: the client schema as a TypeScript module for @rindle/client."""

import io
import json
import os
import re
import shutil
import subprocess
from pathlib import Path

import pytest
from django.core.management import CommandError, call_command

from rindle_app.schema_ts import render
from tests.conftest import CI

NODE_MODULES = Path(
    os.environ.get("RINDLE_NODE_MODULES", Path(__file__).parent / "e2e" / "node" / "node_modules")
)

TABLE = re.compile(
    r'export const (\w+) = table\("([^"]+)"\)\n  \.columns\(\{\n(.*?)  \}\)\n'
    r"  \.primaryKey\(([^)]*)\);\n",
    re.S,
)
COLUMN = re.compile(r"^    (\w+): (\w+)\(\)(\.nullable\(\))?,$")


def parse_ts(text):
    """The tables a generated module defines, in GET /schema's shape."""
    tables = []
    for _const, name, body, keys in TABLE.findall(text):
        columns = []
        for line in body.splitlines():
            match = COLUMN.match(line)
            assert match, line
            columns.append({"name": match[1], "type": match[2], "nullable": match[3] is not None})
        primary_key = [json.loads(k) for k in keys.split(", ")]
        tables.append({"name": name, "columns": columns, "primaryKey": primary_key})
    return tables


def generate(*args):
    out = io.StringIO()
    call_command("rindle_schema_ts", *args, stdout=out, stderr=io.StringIO())
    return out.getvalue()


def test_the_module_defines_exactly_the_served_schema(engine):
    """Every table GET /schema serves, columns in order with types, nullability and pk."""
    text = generate()
    assert parse_ts(text) == engine.base_table_schemas()
    assert 'import { createSchema, number, string, table } from "@rindle/client";' in text
    assert text.endswith(
        "export const schema = createSchema({ tables: [comment, issue, tag, user] });\n"
    )


def test_the_output_is_deterministic_and_written_to_a_file(engine, tmp_path):
    target = tmp_path / "schema.gen.ts"
    generate("--output", str(target))
    assert target.read_text() == generate() == generate()


SAMPLE = [
    {
        "name": "class",
        "columns": [
            {"name": "id", "type": "int64", "nullable": False},
            {"name": "seq", "type": "int64", "nullable": False},
            {"name": "meta", "type": "json", "nullable": True},
            {"name": "open", "type": "boolean", "nullable": True},
        ],
        "primaryKey": ["id", "seq"],
    },
    {
        "name": "string",
        "columns": [{"name": "id", "type": "string", "nullable": False}],
        "primaryKey": ["id"],
    },
    {
        "name": "a",
        "columns": [{"name": "x", "type": "number", "nullable": True}],
        "primaryKey": ["x"],
    },
]


def test_every_wire_type_nullability_and_composite_keys_render():
    text = render(SAMPLE)
    assert parse_ts(text) == sorted(SAMPLE, key=lambda t: t["name"])
    assert "    meta: json().nullable()," in text
    assert '  .primaryKey("id", "seq");' in text
    assert "import { boolean, createSchema, int64, json, number, string, table }" in text


def test_table_constants_never_shadow_keywords_or_builders():
    """A table named class or string gets a constant that compiles and imports still work."""
    text = render(SAMPLE)
    assert 'export const classTable = table("class")' in text
    assert 'export const stringTable = table("string")' in text
    assert "tables: [a, classTable, stringTable]" in text


def test_an_unknown_column_type_is_refused():
    with pytest.raises(ValueError):
        render([{"name": "t", "columns": [{"name": "x", "type": "blob", "nullable": False}],
                 "primaryKey": ["x"]}])  # fmt: skip


def test_an_empty_schema_still_exports_a_schema():
    assert render([]).endswith("export const schema = createSchema({ tables: [] });\n")


CHECK = """
import { normalizedTableSchemas } from "@rindle/client";
import { schema } from "./schema.gen.mjs";
const tables = Object.values(schema.tables).map((t) => ({
  name: t.name,
  columns: Object.entries(t.columns).map(([name, c]) => ({
    name, type: c.type, nullable: c.optional === true,
  })),
  primaryKey: t.primaryKey,
}));
console.log(JSON.stringify({ tables, normalized: normalizedTableSchemas(schema) }));
"""


@pytest.mark.parametrize("source", ["demo", "sample"])
def test_node_loads_the_module_with_the_published_client(engine, tmp_path, source):
    """
    The module, run by Node against @rindle/client (it has no type annotations, so it
    is its own JavaScript), builds the schema the server serves: the same tables,
    column order, types, nullability and keys.
    """
    if shutil.which("node") is None or not (NODE_MODULES / "@rindle" / "client").is_dir():
        message = (
            f"node or @rindle/client under {NODE_MODULES} is not installed (make install-test)"
        )
        if CI:
            pytest.fail(message + " (CI=true: required)")
        pytest.skip(message)
    tables = engine.base_table_schemas() if source == "demo" else SAMPLE
    (tmp_path / "node_modules").symlink_to(NODE_MODULES)
    (tmp_path / "schema.gen.mjs").write_text(render(tables))
    (tmp_path / "check.mjs").write_text(CHECK)
    done = subprocess.run(
        ["node", "check.mjs"], cwd=tmp_path, capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 0, done.stderr
    result = json.loads(done.stdout)
    want = sorted(tables, key=lambda t: t["name"])
    assert sorted(result["tables"], key=lambda t: t["name"]) == want
    assert result["normalized"] == [
        {
            "name": t["name"],
            "columns": [c["name"] for c in t["columns"]],
            "primaryKey": [[c["name"] for c in t["columns"]].index(k) for k in t["primaryKey"]],
        }
        for t in want
    ]


def test_a_missing_synced_table_is_a_command_error(engine):
    from django.db import connection

    with connection.cursor() as cursor:
        cursor.execute('ALTER TABLE "tag" RENAME TO "tag_away"')
    try:
        with pytest.raises(CommandError, match="tag"):
            generate()
    finally:
        with connection.cursor() as cursor:
            cursor.execute('ALTER TABLE "tag_away" RENAME TO "tag"')
