"""``manage.py rindle_migrate DIR``: a folder of .sql files, applied in name order."""

import hashlib
import io

import pytest
from django.core.management import CommandError, call_command

from .conftest import journal_rows, rows, state

pytestmark = pytest.mark.django_db(transaction=True)

NOTE = "CREATE TABLE jt_note (id TEXT PRIMARY KEY, body TEXT, tag TEXT);\n"


def run(folder):
    out = io.StringIO()
    call_command("rindle_migrate", str(folder), stdout=out, no_color=True)
    return out.getvalue().splitlines()


def write(folder, name, text):
    path = folder / name
    path.write_text(text)
    return path


def test_files_apply_in_name_order_then_report_present(engine, tmp_path):
    write(tmp_path, "0002_seed.sql", "INSERT INTO jt_note (id, body) VALUES ('a', 'x');\n")
    write(tmp_path, "0001_notes.sql", NOTE)
    write(tmp_path, "README.md", "not a migration")
    assert run(tmp_path) == [
        "applied 0001_notes (ddl, 1 statements)",
        "applied 0002_seed (dml, 1 row changes)",
        "schema version: 0001_notes",
    ]
    assert [key for key, _c, _cc in journal_rows()] == ["0001_notes", "0002_seed"]
    assert journal_rows()[0][1] == hashlib.sha256(NOTE.encode()).hexdigest()
    before = state()
    assert run(tmp_path) == [
        "present 0001_notes",
        "present 0002_seed",
        "schema version: 0001_notes",
    ]
    assert state() == before
    assert rows("SELECT id FROM jt_note") == [("a",)]


def test_destructive_statements_print_a_notice(engine, tmp_path):
    write(tmp_path, "0001_notes.sql", NOTE)
    write(tmp_path, "0002_drop_tag.sql", "ALTER TABLE jt_note DROP COLUMN tag;\n")
    lines = run(tmp_path)
    assert "applied 0002_drop_tag (ddl, 1 statements)" in lines
    assert "[destructive] 0002_drop_tag: ALTER TABLE jt_note DROP COLUMN tag" in lines
    assert not any("[destructive] 0001" in line for line in lines)


def test_an_edited_file_fails_and_stops_the_run(engine, tmp_path):
    write(tmp_path, "0001_notes.sql", NOTE)
    run(tmp_path)
    write(tmp_path, "0001_notes.sql", NOTE.replace("tag TEXT", "tag TEXT NOT NULL"))
    write(tmp_path, "0002_seed.sql", "INSERT INTO jt_note (id) VALUES ('a');\n")
    before = state()
    with pytest.raises(CommandError, match="0001_notes: checksum_mismatch"):
        run(tmp_path)
    assert state() == before


def test_a_cosmetic_edit_passes_with_the_stored_hash_as_override(engine, tmp_path):
    path = write(tmp_path, "0001_notes.sql", NOTE)
    stored = hashlib.sha256(path.read_bytes()).hexdigest()
    run(tmp_path)
    write(tmp_path, "0001_notes.sql", "-- the notes table\n" + NOTE)
    with pytest.raises(CommandError, match="checksum_mismatch"):
        run(tmp_path)
    write(tmp_path, "0001_notes.sql", f"-- OVERRIDE_HASH: {'0' * 64}\n-- the notes table\n" + NOTE)
    with pytest.raises(CommandError, match="override_mismatch"):
        run(tmp_path)
    write(tmp_path, "0001_notes.sql", f"-- OVERRIDE_HASH: {stored}\n-- the notes table\n" + NOTE)
    assert run(tmp_path)[0] == "present 0001_notes (hash overridden)"
    assert run(tmp_path)[0] == "present 0001_notes"


def test_a_refused_file_stops_the_run_before_anything_applies(engine, tmp_path):
    write(tmp_path, "0001_notes.sql", NOTE)
    write(
        tmp_path, "0002_mixed.sql", "ALTER TABLE jt_note ADD COLUMN x TEXT;\nDELETE FROM jt_note;\n"
    )
    before = state()
    with pytest.raises(CommandError, match="0002_mixed.sql: mixed_migration"):
        run(tmp_path)
    assert state() == before


def test_a_failing_file_keeps_the_earlier_ones(engine, tmp_path):
    write(tmp_path, "0001_notes.sql", NOTE)
    write(tmp_path, "0002_dup.sql", NOTE)
    with pytest.raises(CommandError, match="0002_dup: statement_failed"):
        run(tmp_path)
    assert [key for key, _c, _cc in journal_rows()] == ["0001_notes"]


def test_a_missing_folder_is_an_error(engine, tmp_path):
    with pytest.raises(CommandError, match="is not a directory"):
        run(tmp_path / "nope")
