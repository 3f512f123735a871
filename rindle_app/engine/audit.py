"""The foreign-key audit: report rows whose declared reference has no target."""

from dataclasses import dataclass, field
from types import SimpleNamespace

from django.db import connections

from ..conf import rindle_settings
from .engine import running_engine
from .identifiers import quote
from .registry import introspect_tables


@dataclass
class ForeignKeyAudit:
    """``violations``: one dict per orphan row; ``truncated``: the cap was reached."""

    checked: list = field(default_factory=list)
    violations: list = field(default_factory=list)
    truncated: bool = False

    @property
    def ok(self):
        return not self.violations


def run_audit(using=None, max_rows=1000):
    """
    The ``ForeignKeyAudit`` of ``using``'s registered tables, at most ``max_rows``
    violations. A running engine of this process audits its own table map (tables it
    registered at run time included); otherwise the tables an engine would register
    are read from the database, so the audit writes nothing and starts no writer.
    Both ``manage.py rindle_fk_audit`` and the admin's audit page call it.
    """
    using = using or rindle_settings.DATABASE
    engine = running_engine(using)
    if engine is not None:
        return engine.foreign_key_audit(max_rows)
    return foreign_key_audit(
        SimpleNamespace(using=using, tables=introspect_tables(using)), max_rows
    )


def foreign_key_audit(engine, max_rows=1000):
    """
    Walk every declared foreign key of every registered table and report at most
    ``max_rows`` violating rows. Costs one anti-join per key, read-only, on a
    connection of the calling thread (it never blocks the writer).
    """
    audit = ForeignKeyAudit()
    remaining = max(0, int(max_rows))
    with connections[engine.using].cursor() as cursor:
        for table in engine.tables:
            for fk in table.foreign_keys:
                if fk.ref_table not in engine.tables:
                    continue
                audit.checked.append(
                    {"table": table.name, "columns": list(fk.columns), "references": fk.ref_table}
                )
                if remaining == 0:
                    audit.truncated = True
                    continue
                on = " AND ".join(
                    f"p.{quote(rc)} = c.{quote(cc)}" for cc, rc in zip(fk.columns, fk.ref_columns)
                )
                not_null = " AND ".join(f"c.{quote(cc)} IS NOT NULL" for cc in fk.columns)
                key_cols = ", ".join(f"c.{quote(k)}" for k in table.primary_key)
                fk_cols = ", ".join(f"c.{quote(cc)}" for cc in fk.columns)
                cursor.execute(
                    f"SELECT {key_cols}, {fk_cols} FROM {quote(table.name)} c "
                    f"LEFT JOIN {quote(fk.ref_table)} p ON {on} "
                    f"WHERE {not_null} AND p.{quote(fk.ref_columns[0])} IS NULL "
                    f"ORDER BY {key_cols} LIMIT %s",
                    [remaining + 1],
                )
                rows = cursor.fetchall()
                if len(rows) > remaining:
                    rows = rows[:remaining]
                    audit.truncated = True
                npk = len(table.primary_key)
                for r in rows:
                    audit.violations.append(
                        {
                            "table": table.name,
                            "pk": list(r[:npk]),
                            "columns": list(fk.columns),
                            "values": list(r[npk:]),
                            "references": fk.ref_table,
                        }
                    )
                remaining -= len(rows)
    return audit
