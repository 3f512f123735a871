"""
The parent's side of the schema-change tests: migrations of the test app
``tests.schema_app`` written into a temporary package, applied by a real
``manage.py migrate`` in a child process on this test run's database
(``tests/support/schema_settings.py``), and the outbox read back.
"""

import json
import subprocess
import sys
import textwrap
import uuid

import pytest
from django.db import connection

from rindle_app.engine.capture import OUTBOX

from .processes import ROOT, child_env

HEADER = "from django.db import migrations, models\n\n\n"
MIGRATE_TIMEOUT = 120


class SchemaProject:
    """A migrations package of ``schema_app`` in ``directory``, and how to apply it."""

    def __init__(self, directory, synced=("schema_app.Note",), migrations=True):
        self.directory = directory
        self.package = f"schema_mig_{uuid.uuid4().hex[:8]}" if migrations else ""
        self.synced = synced
        self.names = []
        if migrations:
            (directory / self.package).mkdir()
            (directory / self.package / "__init__.py").write_text("")

    def env(self, **extra):
        return child_env(
            DJANGO_SETTINGS_MODULE="tests.support.schema_settings",
            PYTHONPATH=f"{self.directory}:{ROOT}",
            RINDLE_SCHEMA_MIGRATIONS=self.package,
            RINDLE_SCHEMA_SYNCED=",".join(self.synced),
            **extra,
        )

    def write(self, name, operations):
        """Add migration ``name`` after the previous one; ``operations`` is Python source."""
        depends = f'[("schema_app", "{self.names[-1]}")]' if self.names else "[]"
        body = textwrap.indent(textwrap.dedent(operations).strip(), " " * 8)
        source = (
            HEADER + "class Migration(migrations.Migration):\n"
            f"    dependencies = {depends}\n"
            f"    operations = [\n{body}\n    ]\n"
        )
        (self.directory / self.package / f"{name}.py").write_text(source)
        self.names.append(name)
        return name

    def migrate(self, *args, check=True):
        """Run ``manage.py migrate *args`` in a child; its CompletedProcess."""
        done = subprocess.run(
            [sys.executable, "manage.py", "migrate", *args, "--verbosity", "0"],
            cwd=ROOT,
            env=self.env(),
            capture_output=True,
            text=True,
            timeout=MIGRATE_TIMEOUT,
        )
        if check and done.returncode != 0:
            pytest.fail(f"migrate {' '.join(args)} failed:\n{done.stderr[-4000:]}")
        return done

    def clean(self):
        """Unapply every migration of the app, then drop what is left of it."""
        if self.package and self.names:
            self.migrate("schema_app", "zero", check=False)
        with connection.cursor() as cursor:
            for name in connection.introspection.table_names(cursor):
                if name.startswith("schema_app_"):
                    cursor.execute(f'DROP TABLE "{name}"')
            cursor.execute("DELETE FROM django_migrations WHERE app = 'schema_app'")


def last_seq():
    with connection.cursor() as cursor:
        cursor.execute(f"SELECT COALESCE(MAX(seq), 0) FROM {OUTBOX}")
        return cursor.fetchone()[0]


def events(after=0, table=None):
    """[(seq, table, op, old, new)] of the outbox after ``after`` (of ``table``)."""
    sql = f'SELECT seq, "table", op, old, new FROM {OUTBOX} WHERE seq > %s'
    params = [after]
    if table is not None:
        sql += ' AND "table" = %s'
        params.append(table)
    with connection.cursor() as cursor:
        cursor.execute(sql + " ORDER BY seq", params)
        rows = cursor.fetchall()
    return [(s, t, op, _json(old), _json(new)) for s, t, op, old, new in rows]


def _json(value):
    return json.loads(value) if isinstance(value, (str, bytes)) else value


def columns(table):
    with connection.cursor() as cursor:
        return [c.name for c in connection.introspection.get_table_description(cursor, table)]


def execute(sql, params=()):
    with connection.cursor() as cursor:
        cursor.execute(sql, list(params))
