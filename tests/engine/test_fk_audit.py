"""The foreign-key audit as operators run it: ``manage.py rindle_fk_audit`` and the admin page."""

import json
import subprocess
import sys
from io import StringIO

import pytest
from django.contrib.auth.models import Permission
from django.core.management import CommandError, call_command
from django.db import connection
from django.urls import reverse

from project.demo.models import Comment, Tag, User
from rindle_app.engine import get_engine, shutdown
from tests.conftest import child_env
from tests.support.demo import create_issue

AUDIT_URL = "/admin/rindle_app/changeevent/fk-audit/"
DEMO_KEYS = {
    ("comment", ("authorId",), "user"),
    ("comment", ("issueId",), "issue"),
    ("issue", ("ownerId",), "user"),
    ("tag", ("issueId",), "issue"),
}


def linked_rows():
    """A user, an issue and a comment whose references all resolve."""
    User.objects.create(id="u1", name="Ann")
    create_issue("i1", created=1)
    Comment.objects.create(id="ok", issue_id="i1", author_id="u1", body="b", created_at=1)


def orphans():
    """Three comments of a deleted issue and a tag of another: four violating rows."""
    linked_rows()
    for i in range(3):
        Comment.objects.create(id=f"c{i}", issue_id="gone", author_id="u1", body="b", created_at=1)
    Tag.objects.create(id="t1", issue_id="missing", name="bug")


def audit(*args):
    """(stdout, the CommandError or None) of ``rindle_fk_audit *args``."""
    out, err = StringIO(), StringIO()
    try:
        call_command("rindle_fk_audit", *args, stdout=out, stderr=err)
    except CommandError as exc:
        return out.getvalue(), exc
    return out.getvalue(), None


# --- the management command ------------------------------------------------------


@pytest.mark.django_db
def test_a_clean_database_lists_the_checked_keys_and_passes():
    """Every declared key is listed; no violation means no error (exit status 0)."""
    linked_rows()
    text, failure = audit()
    assert failure is None
    assert "Checked 4 foreign key(s):" in text
    for table, columns, references in DEMO_KEYS:
        assert f"  {table}({', '.join(columns)}) -> {references}" in text
    assert "No violations." in text


@pytest.mark.django_db
def test_orphan_rows_are_listed_and_fail_with_status_1():
    """Each orphan is named by table, key and missing reference; the command fails with 1."""
    orphans()
    text, failure = audit()
    assert failure is not None and failure.returncode == 1
    assert "4 foreign key violations found" in str(failure)
    assert "4 violating row(s):" in text
    for i in range(3):
        assert f"  comment ['c{i}']: issueId='gone' has no row in issue" in text
    assert "  tag ['t1']: issueId='missing' has no row in issue" in text
    assert "ok'" not in text and "Truncated" not in text


@pytest.mark.django_db
def test_json_output_reports_keys_violations_and_the_cap():
    """--json prints one document: checked keys, violating rows, the cap, truncated."""
    orphans()
    text, failure = audit("--json")
    assert failure.returncode == 1
    report = json.loads(text)
    assert report["ok"] is False and report["truncated"] is False
    assert report["maxRows"] == 1000
    assert {(k["table"], tuple(k["columns"]), k["references"]) for k in report["checked"]} == (
        DEMO_KEYS
    )
    found = {(v["table"], v["pk"][0], v["values"][0]) for v in report["violations"]}
    assert found == {
        ("comment", "c0", "gone"),
        ("comment", "c1", "gone"),
        ("comment", "c2", "gone"),
        ("tag", "t1", "missing"),
    }
    assert all(v["references"] == "issue" for v in report["violations"])


@pytest.mark.django_db
def test_max_rows_caps_the_report_and_says_truncated():
    """With more orphans than --max-rows, exactly the cap is listed and marked truncated."""
    orphans()
    text, failure = audit("--max-rows", "2")
    assert failure.returncode == 1
    assert "2 foreign key violations found (truncated)" in str(failure)
    assert "2 violating row(s):" in text
    assert text.count("has no row in") == 2
    assert "Truncated at --max-rows 2: more violations may exist." in text
    report = json.loads(audit("--max-rows", "2", "--json")[0])
    assert len(report["violations"]) == 2 and report["truncated"] is True


@pytest.mark.django_db
@pytest.mark.parametrize("value", ["0", "-3", "many", "1.5", "1000000001", "9" * 5000])
def test_max_rows_must_be_a_whole_number_from_1_to_a_billion(value):
    """A bad --max-rows is a usage error before anything runs."""
    orphans()
    with pytest.raises(CommandError, match="--max-rows"):
        call_command("rindle_fk_audit", "--max-rows", value, stdout=StringIO())


@pytest.mark.django_db
def test_a_missing_synced_table_is_an_error_with_status_2():
    """Before migrate has created a synced table there is nothing to audit: status 2."""
    with connection.cursor() as cursor:
        cursor.execute('DROP TABLE "comment"')  # rolled back with the test's transaction
    text, failure = audit()
    assert failure is not None and failure.returncode == 2
    assert "comment" in str(failure) and text == ""


@pytest.mark.django_db
def test_an_unknown_database_alias_is_an_error_with_status_2():
    text, failure = audit("--database", "nope")
    assert failure is not None and failure.returncode == 2
    assert "nope" in str(failure) and text == ""


@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize(
    "setup, args, status",
    [
        (linked_rows, [], 0),
        (orphans, ["--json"], 1),
        (orphans, ["--max-rows", "0"], 2),
    ],
    ids=["clean", "violations", "bad-cap"],
)
def test_the_exit_status_from_the_command_line(setup, args, status):
    """The shell sees 0 when clean, 1 on violations (stdout still pure JSON), 2 on misuse."""
    setup()
    proc = subprocess.run(
        [sys.executable, "manage.py", "rindle_fk_audit", *args],
        env=child_env(),
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == status, (proc.stdout, proc.stderr)
    if status == 1:
        assert len(json.loads(proc.stdout)["violations"]) == 4
        assert "4 foreign key violations found" in proc.stderr
    if status == 2:
        assert "--max-rows" in proc.stderr and proc.stdout == ""


ORPHAN_INSERT = 'INSERT INTO "fka_child" VALUES (%s, %s), (%s, %s)'


@pytest.fixture
def declared_only_fk(transactional_db):
    """
    A raw-DDL child table whose reference is declared but not enforced for an existing
    orphan row (SQLite: inserted with enforcement off; PostgreSQL: a NOT VALID
    constraint), registered with the process's engine at run time.
    """
    shutdown()
    with connection.cursor() as cursor:
        cursor.execute('CREATE TABLE "fka_parent" ("id" TEXT PRIMARY KEY)')
        cursor.execute('INSERT INTO "fka_parent" VALUES (%s)', ["p1"])
        if connection.vendor == "sqlite":
            cursor.execute("PRAGMA foreign_keys = OFF")
            cursor.execute(
                'CREATE TABLE "fka_child" ("id" TEXT PRIMARY KEY, '
                '"parent" TEXT REFERENCES "fka_parent" ("id"))'
            )
            cursor.execute(
                'INSERT INTO "fka_child" VALUES (%s, %s), (%s, %s)', ["a", "p1", "b", "x"]
            )
            cursor.execute("PRAGMA foreign_keys = ON")
        else:
            cursor.execute('CREATE TABLE "fka_child" ("id" TEXT PRIMARY KEY, "parent" TEXT)')
            cursor.execute(
                'INSERT INTO "fka_child" VALUES (%s, %s), (%s, %s)', ["a", "p1", "b", "x"]
            )
            cursor.execute(
                'ALTER TABLE "fka_child" ADD CONSTRAINT "fka_child_parent" FOREIGN KEY ("parent") '
                'REFERENCES "fka_parent" ("id") NOT VALID'
            )
    engine = get_engine()
    try:
        engine.register_existing_table("fka_parent")
        engine.register_existing_table("fka_child")
        yield engine
    finally:
        shutdown()
        with connection.cursor() as cursor:
            cursor.execute('DROP TABLE "fka_child"')
            cursor.execute('DROP TABLE "fka_parent"')


def test_a_running_engine_audits_the_tables_it_registered(declared_only_fk):
    """Tables registered at run time (not synced models) are audited through the engine."""
    text, failure = audit("--json")
    assert failure.returncode == 1
    report = json.loads(text)
    assert {"table": "fka_child", "columns": ["parent"], "references": "fka_parent"} in report[
        "checked"
    ]
    assert report["violations"] == [
        {
            "table": "fka_child",
            "pk": ["b"],
            "columns": ["parent"],
            "values": ["x"],
            "references": "fka_parent",
        }
    ]


# --- the admin page --------------------------------------------------------------


@pytest.mark.django_db
def test_the_audit_page_is_reachable_from_the_rindle_app_index(operator):
    """The rindle app index links the audit; opening it shows the form and runs nothing."""
    assert reverse("admin:rindle_app_fk_audit") == AUDIT_URL
    index = operator.get(reverse("admin:app_list", args=["rindle_app"]))
    assert f'href="{AUDIT_URL}"' in index.text
    orphans()
    page = operator.get(AUDIT_URL)
    assert page.status_code == 200
    assert 'name="max_rows"' in page.text
    assert "fk-audit-violations" not in page.text and "fk-audit-clean" not in page.text


@pytest.mark.django_db
def test_an_operator_sees_the_violations(operator):
    """Running the audit lists the checked keys and every orphan with its missing target."""
    orphans()
    page = operator.get(AUDIT_URL, {"max_rows": "100"})
    assert page.status_code == 200
    assert "<caption>4 foreign keys checked</caption>" in page.text
    assert "<caption>4 violating rows</caption>" in page.text
    for pk in ("c0", "c1", "c2", "t1"):
        assert f"<td>{pk}</td>" in page.text
    assert "<td>issueId = gone</td>" in page.text
    assert "<td>issueId = missing</td>" in page.text
    assert "<td>ok</td>" not in page.text
    assert "fk-audit-truncated" not in page.text


@pytest.mark.django_db
def test_a_clean_database_says_so(operator):
    linked_rows()
    page = operator.get(AUDIT_URL, {"max_rows": "100"})
    assert page.status_code == 200
    assert "fk-audit-clean" in page.text and "fk-audit-violations" not in page.text


@pytest.mark.django_db
def test_the_page_caps_the_rows_it_shows(operator):
    """max_rows caps the listing and the page says it was truncated."""
    orphans()
    page = operator.get(AUDIT_URL, {"max_rows": "1"})
    assert page.status_code == 200
    assert "<caption>1 violating row</caption>" in page.text
    assert page.text.count("<td>issueId = ") == 1
    assert "Truncated at the cap of 1: more violations may exist." in page.text


@pytest.mark.django_db
@pytest.mark.parametrize("value", ["0", "-1", "abc", "10001", "", "9" * 5000])
def test_a_bad_cap_is_refused_with_400(operator, value):
    orphans()
    page = operator.get(AUDIT_URL, {"max_rows": value})
    assert page.status_code == 400
    assert "The cap must be a whole number from 1 to 10000." in page.text
    assert "fk-audit-violations" not in page.text


@pytest.mark.django_db
def test_a_missing_synced_table_is_shown_as_an_error(operator):
    with connection.cursor() as cursor:
        cursor.execute('DROP TABLE "comment"')  # rolled back with the test's transaction
    page = operator.get(AUDIT_URL, {"max_rows": "10"})
    assert page.status_code == 503
    assert "table &#x27;comment&#x27; does not exist" in page.text


@pytest.mark.django_db
def test_anonymous_visitors_are_sent_to_log_in(client):
    orphans()
    response = client.get(AUDIT_URL, {"max_rows": "10"})
    assert response.status_code == 302
    assert response["Location"].startswith(reverse("admin:login"))


@pytest.mark.django_db
def test_a_signed_in_user_who_is_not_staff_is_refused(client, django_user_model):
    """Outside the staff, even with the outbox view permission, the admin sends to log in."""
    user = django_user_model.objects.create_user("visitor")
    user.user_permissions.add(Permission.objects.get(codename="view_changeevent"))
    client.force_login(user)
    orphans()
    response = client.get(AUDIT_URL, {"max_rows": "10"})
    assert response.status_code == 302
    assert response["Location"].startswith(reverse("admin:login"))
    assert "gone" not in response.text


@pytest.mark.django_db
def test_staff_need_the_outbox_view_permission(staff):
    """The audit shows synced rows' keys: it opens to whoever may view the outbox."""
    orphans()
    assert staff.get(AUDIT_URL, {"max_rows": "10"}).status_code == 403
    staff.user.user_permissions.add(Permission.objects.get(codename="view_changeevent"))
    page = staff.get(AUDIT_URL, {"max_rows": "10"})
    assert page.status_code == 200
    assert "<caption>4 violating rows</caption>" in page.text
    index = staff.get(reverse("admin:app_list", args=["rindle_app"]))
    assert f'href="{AUDIT_URL}"' in index.text
