"""
Capture triggers: every row change of a registered table is appended to the
outbox ``_rindle_change_events`` inside the writing transaction.

Triggers live in the database, so writes from any connection are captured: the
engine, the ORM in any process, the admin, raw SQL from a shell.
"""

import hashlib

from django.db import DatabaseError

from .identifiers import quote

OUTBOX = "_rindle_change_events"
_MAX_FINITE = "1.7976931348623157e308"


def trigger_names(table):
    digest = hashlib.sha1(table.encode()).hexdigest()[:10]
    base = f"_rindle_cap_{digest}"
    return {"add": f"{base}_ins", "edit": f"{base}_upd", "remove": f"{base}_del"}


def install(cursor, vendor, table):
    """Create or refresh the capture triggers of ``table`` (a ``Table``)."""
    if vendor == "sqlite":
        _install_sqlite(cursor, table)
    elif vendor == "postgresql":
        _install_postgres(cursor, table)
    else:  # pragma: no cover - refused by the system checks
        raise NotImplementedError(f"capture is not implemented for {vendor}")


def remove(cursor, vendor, table_name):
    """Drop the capture triggers of ``table_name``."""
    if vendor == "postgresql":
        cursor.execute("SELECT pg_advisory_xact_lock(%s)", [INSTALL_KEY])
    for name in trigger_names(table_name).values():
        if vendor == "sqlite":
            cursor.execute(f"DROP TRIGGER IF EXISTS {quote(name)}")
        else:
            cursor.execute(f"DROP TRIGGER IF EXISTS {quote(name)} ON {quote(table_name)}")


# --- SQLite -----------------------------------------------------------------


def _sqlite_value(ref, column):
    # json_object() prints REALs with 15 significant digits, which is lossy;
    # %!.17g round-trips every finite double. Infinities keep the raw path.
    if column.type == "json":
        return f"json({ref})"
    return (
        f"CASE WHEN typeof({ref}) = 'real' AND abs({ref}) <= {_MAX_FINITE} "
        f"THEN json(printf('%!.17g', {ref})) "
        f"WHEN typeof({ref}) = 'blob' THEN hex({ref}) ELSE {ref} END"
    )


def sqlite_image(alias, table):
    """SQL rendering row ``alias`` of ``table`` as the JSON image capture records."""
    parts = ", ".join(
        f"'{c.name}', {_sqlite_value(f'{alias}.{quote(c.name)}', c)}" for c in table.columns
    )
    return f"json_object({parts})"


def _sqlite_key(alias, table):
    cols = {c.name: c for c in table.columns}
    parts = ", ".join(_sqlite_value(f"{alias}.{quote(n)}", cols[n]) for n in table.primary_key)
    return f"json_array({parts})"


def sqlite_trigger_sql(table):
    """The three CREATE TRIGGER statements of ``table``, keyed by op."""
    names = trigger_names(table.name)
    t = quote(table.name)
    lit = table.name
    insert = f'INSERT INTO {OUTBOX} (txid, "table", op, pk, old, new) VALUES'
    changed = " OR ".join(f"OLD.{quote(c.name)} IS NOT NEW.{quote(c.name)}" for c in table.columns)
    return {
        "add": (
            f"CREATE TRIGGER {quote(names['add'])} AFTER INSERT ON {t} BEGIN "
            f"{insert} (NULL, '{lit}', 'add', {_sqlite_key('NEW', table)}, NULL, "
            f"{sqlite_image('NEW', table)}); END"
        ),
        "edit": (
            f"CREATE TRIGGER {quote(names['edit'])} AFTER UPDATE ON {t} WHEN {changed} BEGIN "
            f"{insert} (NULL, '{lit}', 'edit', {_sqlite_key('OLD', table)}, "
            f"{sqlite_image('OLD', table)}, {sqlite_image('NEW', table)}); END"
        ),
        "remove": (
            f"CREATE TRIGGER {quote(names['remove'])} AFTER DELETE ON {t} BEGIN "
            f"{insert} (NULL, '{lit}', 'remove', {_sqlite_key('OLD', table)}, "
            f"{sqlite_image('OLD', table)}, NULL); END"
        ),
    }


def _install_sqlite(cursor, table):
    wanted = sqlite_trigger_sql(table)
    names = trigger_names(table.name)
    cursor.execute(
        "SELECT name, sql FROM sqlite_master WHERE type = 'trigger' AND tbl_name = %s",
        [table.name],
    )
    existing = dict(cursor.fetchall())
    for op, sql in wanted.items():
        name = names[op]
        if existing.get(name) == sql:
            continue
        cursor.execute(f"DROP TRIGGER IF EXISTS {quote(name)}")
        cursor.execute(sql)


# --- PostgreSQL -------------------------------------------------------------


def last_seq(tx):
    """
    Inside a write transaction, right after it captured rows: the seq of its last
    outbox row. Postgres: the last value this session drew (the guard draws every
    seq, below); SQLite: the greatest seq, since its one writer holds the database.
    If it captured nothing (every change left its row as it was), a lower seq or None.
    """
    if tx.vendor != "postgresql":
        return tx.scalar(f"SELECT MAX(seq) FROM {OUTBOX}")
    try:
        with tx.savepoint():  # currval fails in a session that never drew one
            return tx.scalar(f"SELECT currval(pg_get_serial_sequence('{OUTBOX}', 'seq'))")
    except DatabaseError:
        return None


NOTIFY_CHANNEL = "rindle_outbox"
# The advisory lock key of the outbox fence (an arbitrary constant: "rindle" in ASCII).
FENCE_KEY = 0x72696E646C65
# The watermarker's "awake" key ("rwake" in ASCII): held (session level, exclusive) by
# a leader that steps every refresh interval anyway, so capture sends no NOTIFY then.
# A capturing transaction that takes its shared side (it is free: the leader sleeps)
# notifies, and holds it until it ends. See stream.watermark, "The bell".
WAKE_KEY = 0x7277616B65

_PG_FUNCTION = f"""
CREATE OR REPLACE FUNCTION _rindle_capture() RETURNS trigger LANGUAGE plpgsql
SECURITY DEFINER SET search_path = {{schema}}, pg_temp AS $$
DECLARE
    old_image jsonb;
    new_image jsonb;
    key_image jsonb;
BEGIN
    IF TG_OP <> 'INSERT' THEN old_image := to_jsonb(OLD); END IF;
    IF TG_OP <> 'DELETE' THEN new_image := to_jsonb(NEW); END IF;
    SELECT jsonb_agg(COALESCE(old_image, new_image) -> k ORDER BY i)
      INTO key_image FROM unnest(TG_ARGV) WITH ORDINALITY AS u(k, i);
    -- seq 0 stands for "draw it behind the fence": the outbox's guard trigger
    -- takes the shared side of the fence, then draws the seq (see _PG_GUARD).
    INSERT INTO {OUTBOX} (seq, txid, "table", op, pk, old, new) VALUES (
        0, pg_current_xact_id()::text::bigint, TG_TABLE_NAME,
        CASE TG_OP WHEN 'INSERT' THEN 'add' WHEN 'UPDATE' THEN 'edit' ELSE 'remove' END,
        key_image, old_image, new_image);
    -- Wake the watermarker (stream.watermark), but only while it sleeps: while it
    -- steps every refresh interval it holds WAKE_KEY, the try fails and nothing is
    -- sent. Every NOTIFY signals every listening session of the database (Postgres
    -- filters by channel in the receiver), so one per commit would cost each write
    -- a wake-up of every app server. The payload is the transaction id: a
    -- transaction's rows make one notification, delivered at commit; never rows.
    IF pg_try_advisory_xact_lock_shared({WAKE_KEY}) THEN
        PERFORM pg_notify('{NOTIFY_CHANNEL}', pg_current_xact_id()::text);
    END IF;
    RETURN NULL;
END $$
"""


GUARD = "_rindle_outbox_fence"

# The outbox's guard: EVERY insert into the outbox, whatever wrote it (the capture
# function, the ORM, bulk_create, raw SQL, a data migration), takes the SHARED side
# of the fence and only then draws its seq, so the fence is held from before the
# seq exists until commit (the watermarker's premise, stream.watermark). Taking
# the fence here rather than refusing an unfenced insert: the identity DEFAULT is
# evaluated before any BEFORE trigger, so a seq drawn by the default is drawn
# outside the fence; this trigger throws that value away (a permanent hole, which
# readers never wait for) and draws another. An explicit seq is replaced the same
# way, so no caller can place a row below the published watermark. Re-taking a
# lock the transaction already holds is a local lookup, far cheaper than scanning
# pg_locks per row to refuse (docs/benchmarks.md). A savepoint rolled back
# releases a fence taken inside it, together with the rows it fenced; the next
# insert takes it again.
_PG_GUARD = f"""
CREATE OR REPLACE FUNCTION {GUARD}() RETURNS trigger LANGUAGE plpgsql
SECURITY DEFINER SET search_path = {{schema}}, pg_temp AS $$
BEGIN
    PERFORM pg_advisory_xact_lock_shared({FENCE_KEY});
    NEW.seq := nextval({{sequence}}::regclass);
    RETURN NEW;
END $$
"""


def _install_guard(cursor, schema):
    cursor.execute("SELECT quote_literal(pg_get_serial_sequence(%s, 'seq'))", [OUTBOX])
    sequence = cursor.fetchone()[0]
    cursor.execute(_PG_GUARD.replace("{schema}", schema).replace("{sequence}", sequence))
    cursor.execute(
        "SELECT 1 FROM pg_trigger WHERE tgname = %s AND tgrelid = %s::regclass",
        [GUARD, OUTBOX],
    )
    if cursor.fetchone() is None:
        cursor.execute(
            f"CREATE TRIGGER {GUARD} BEFORE INSERT ON {OUTBOX} FOR EACH ROW "
            f"EXECUTE FUNCTION {GUARD}()"
        )


def _pg_trigger_sql(table):
    names = trigger_names(table.name)
    t = quote(table.name)
    args = ", ".join("'" + c + "'" for c in table.primary_key)
    events = {"add": "INSERT", "edit": "UPDATE", "remove": "DELETE"}
    # A row of a table with a ``json`` column (no equality operator) cannot be compared
    # as a record: ``OLD.* IS DISTINCT FROM NEW.*`` raises once the columns before it are
    # equal. Such a table compares the rows' jsonb images (value equality) instead.
    changed = "OLD.* IS DISTINCT FROM NEW.*"
    if any(c.declared.lower() == "json" for c in table.columns):
        changed = "to_jsonb(OLD) IS DISTINCT FROM to_jsonb(NEW)"
    out = {}
    for op, event in events.items():
        when = f" WHEN ({changed})" if op == "edit" else ""
        out[op] = (
            f"CREATE TRIGGER {quote(names[op])} AFTER {event} ON {t} FOR EACH ROW{when} "
            f"EXECUTE FUNCTION _rindle_capture({args})"
        )
    return out


# The advisory lock key that serializes capture installs ("rindcap" in ASCII).
INSTALL_KEY = 0x72696E64636170


def _install_postgres(cursor, table):
    # Processes that start together (several Daphne workers) each refresh the function
    # and the triggers; two concurrent CREATE OR REPLACE of one function fail one of
    # them ("tuple concurrently updated"), so installs take turns until commit.
    cursor.execute("SELECT pg_advisory_xact_lock(%s)", [INSTALL_KEY])
    # SECURITY DEFINER: a write by the public SQL sandbox role (which may not touch
    # the outbox) is still captured, as the function's owner; its search_path is fixed
    # so nothing the writer's session resolves can stand in for the outbox.
    cursor.execute("SELECT quote_ident(current_schema())")
    schema = cursor.fetchone()[0]
    _install_guard(cursor, schema)
    cursor.execute(_PG_FUNCTION.replace("{schema}", schema))
    wanted = _pg_trigger_sql(table)
    names = trigger_names(table.name)
    for op, sql in wanted.items():
        marker = hashlib.sha1(sql.encode()).hexdigest()
        cursor.execute(
            "SELECT obj_description(t.oid, 'pg_trigger') FROM pg_trigger t "
            "WHERE t.tgname = %s AND t.tgrelid = %s::regclass",
            [names[op], quote(table.name)],
        )
        row = cursor.fetchone()
        if row is not None and row[0] == marker:
            continue
        cursor.execute(f"DROP TRIGGER IF EXISTS {quote(names[op])} ON {quote(table.name)}")
        cursor.execute(sql)
        cursor.execute(
            f"COMMENT ON TRIGGER {quote(names[op])} ON {quote(table.name)} IS '{marker}'"
        )
