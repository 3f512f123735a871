"""
bench/datascale.py's children with Django: the writer and the correctness gate.

One child process (``bench/datascale.py --child helper``), one JSON command per
line on stdin:

- ``write``: ORM writes from a process of its own, ``Issue.objects.filter(pk=..)
  .update(title=..)`` in ``transaction.atomic()``, to issues the subscriptions
  watch, at a steady rate (open loop); each write's title is unique and its commit
  time is ``time.monotonic()`` when the atomic block has returned.
- ``gate``: every subscription the client process dumped (its replica, folded from
  the frames) against the query re-run now in SQL by the oracle
  (``rindle_app.ivm.sql.run_query``): the same named query, resolved for the same
  user, every ``select`` dropped so each rendered row carries all its columns, then
  flattened into the rows a normalized replica holds (the row of every level, and
  one synthetic row per non-zero ``count``). The two sets must be equal, and the
  hello's tables must be the server's. A subscription refused with a queryError is
  not compared (the report lists it). Prints one JSON line.
"""

import dataclasses
import json
import sys
import time


def write(targets, count, rate, label):
    """ORM writes at ``rate``/s (open loop): ``[[title, commit time], ...]``."""
    from django.db import transaction

    from project.demo.models import Issue

    period, commits = 1.0 / rate, []
    start = time.monotonic() + 0.02
    for k in range(count):
        delay = start + k * period - time.monotonic()
        if delay > 0:
            time.sleep(delay)
        title = f"datascale {label} write {k}"
        with transaction.atomic():
            Issue.objects.filter(pk=targets[k % len(targets)]).update(title=title)
        commits.append([title, time.monotonic()])
    return commits


def unselect(query):
    """``query`` with every level's ``select`` dropped: rows render all their columns."""
    related = tuple(dataclasses.replace(r, subquery=unselect(r.subquery)) for r in query.related)
    return dataclasses.replace(query, select=None, related=related)


def number(value):
    # PostgreSQL: to_jsonb prints an integral double without ".0", psycopg gives a float.
    if isinstance(value, float) and value.is_integer():
        return int(value)
    return value


def row_text(table, cells):
    return json.dumps([table, [number(c) for c in cells]], separators=(",", ":"))


def flatten(query, view, schema, out):
    """The normalized rows of ``view`` (the oracle's rendering of ``query``), into ``out``."""
    from rindle_app.ivm.normalized import agg_table_name

    if view is None:
        return
    rows = [view] if isinstance(view, dict) else view
    columns = [c.name for c in schema.get(query.table).wire_columns]
    for row in rows:
        out.add(row_text(query.table, [row.get(c) for c in columns]))
        for related in query.visible_related:
            value = row.get(related.subquery.alias)
            if related.subquery.aggregate == "count":
                if value:
                    parent = [row.get(p) for p in related.parent_fields]
                    out.add(row_text(agg_table_name(related), [*parent, value]))
            elif related.subquery.aggregate is None:
                flatten(related.subquery, value, schema, out)


def gate(dump_path, username):
    """The dumped replicas against the SQL oracle (see the module docstring)."""
    from django.contrib.auth import get_user_model
    from django.db import connection

    from rindle_app.engine import get_engine, shutdown
    from rindle_app.ivm.ast import parse
    from rindle_app.ivm.normalized import normalized_table_schemas
    from rindle_app.ivm.sql import run_query
    from rindle_app.named import resolve

    with open(dump_path) as f:
        dump = json.load(f)
    user = get_user_model().objects.get(username=username)
    schema = get_engine().tables
    checked, failures, refused = 0, [], []
    try:
        for conn, subs in sorted(dump.items()):
            for qid, sub in sorted(subs.items(), key=lambda kv: int(kv[0])):
                where = f"{conn}#{qid} {sub['name']} {json.dumps(sub['args'])}"
                if sub["error"] is not None:
                    refused.append(f"{where}: {sub['error'].get('code')}")
                    continue
                query = parse(resolve(sub["name"], sub["args"], user), schema)
                tables = normalized_table_schemas(query, schema)
                want = set()
                flatten(query, run_query(unselect(query), connection, schema), schema, want)
                got = {row_text(t, cells) for t, cells in sub["rows"]}
                checked += 1
                problems = list(sub["problems"])
                if not sub["seq0"]:
                    problems.append("no seq 0")
                if sorted(sub["tables"], key=lambda t: t["name"]) != tables:
                    problems.append("the hello's tables are not the server's")
                if got != want:
                    problems.append(
                        f"replica {len(got)} rows, SQL {len(want)}; missing "
                        f"{sorted(want - got)[:2]}, extra {sorted(got - want)[:2]}"
                    )
                if problems:
                    failures.append(f"{where}: {'; '.join(problems)}")
    finally:
        shutdown()
        connection.close()
    return {
        "pass": checked > 0 and not failures,
        "checked": checked,
        "failures": failures[:20],
        "refused": refused,
    }


def child_helper():
    """One JSON command per stdin line (write, gate, quit), one JSON answer per line."""
    import django

    django.setup()
    from django.db import connection

    for line in sys.stdin:
        msg = json.loads(line)
        if msg["cmd"] == "write":
            reply = {"commits": write(msg["targets"], msg["count"], msg["rate"], msg["label"])}
            connection.close()  # nothing held open between the phases
        elif msg["cmd"] == "gate":
            reply = gate(msg["dump"], msg["user"])
        else:
            reply = {}
        print(json.dumps(reply), flush=True)
        if msg["cmd"] == "quit":
            return


CHILDREN = {"helper": child_helper}
