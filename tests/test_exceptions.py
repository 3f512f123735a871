"""rindle_app.exceptions: one error vocabulary, its two mappings and its generated docs."""

import inspect
import json
import re
from pathlib import Path

import pytest
from django.core.management import call_command
from django.core.management.base import CommandError

from rindle_app import exceptions as exc_module
from rindle_app.exceptions import (
    CODES,
    FRAME_ERROR,
    FRAME_QUERY_ERROR,
    MID_GAP,
    LimitExceeded,
    MutationGap,
    QueryError,
    QueryRefused,
    QuotaExceeded,
    RindleError,
    SqlError,
    Unavailable,
    to_frame,
    to_response,
)
from rindle_app.management.commands.rindle_docs_errors import DEFAULT_PATH, render

ROOT = Path(__file__).resolve().parent.parent


def _public_classes():
    return [
        obj
        for name, obj in vars(exc_module).items()
        if inspect.isclass(obj) and issubclass(obj, BaseException) and not name.startswith("_")
    ]


def test_committed_error_table_is_current():
    """docs/reference/errors.md is exactly what the table generates (regenerate to fix)."""
    path = ROOT / DEFAULT_PATH
    assert path == ROOT / "docs/reference/errors.md"
    assert path.read_text(encoding="utf-8") == render()
    call_command("rindle_docs_errors", "--check", "--output", str(path))


def test_check_refuses_a_stale_table(tmp_path):
    """The generator's --check fails on a file that differs from the table."""
    stale = tmp_path / "errors.md"
    stale.write_text(render().replace("mid_gap", "mid_gapp"), encoding="utf-8")
    with pytest.raises(CommandError, match="stale"):
        call_command("rindle_docs_errors", "--check", "-o", str(stale))
    call_command("rindle_docs_errors", "-o", str(stale))
    call_command("rindle_docs_errors", "--check", "-o", str(stale))


def test_every_code_is_documented_once_with_one_constant():
    """Each registered code has a meaning, and one constant of its own in the table."""
    text = render()
    for code, entry in CODES.items():
        assert entry.doc, code
        assert text.count(f"\n| `{code}` | `") == 1, code
        assert set(entry.frames) <= {FRAME_ERROR, FRAME_QUERY_ERROR}
        if entry.plane == "sql":
            assert code == code.upper()
        else:
            assert code == code.lower()


def test_class_codes_are_registered_with_the_class_status():
    """A class's own code is in the table, with the status and retryable it answers with."""
    for cls in _public_classes():
        code = cls.__dict__.get("code")
        if not isinstance(code, str):
            continue
        entry = CODES[code]
        status = cls.__dict__.get("status", None)
        if isinstance(status, int):
            assert entry.status == status, cls
        instance_retryable = cls.retryable if issubclass(cls, RindleError) else False
        assert entry.retryable == instance_retryable, cls


def test_old_import_paths_name_the_same_classes():
    """The modules that defined an error class still export it, as the same object."""
    from rindle_app import leases, named
    from rindle_app.engine import errors, journal, migration_sql, mutations, producers, sources
    from rindle_app.engine.changes import RowConflict
    from rindle_app.engine.public_sql import statements
    from rindle_app.flow import quota
    from rindle_app.ivm import ast
    from rindle_app.realtime import limits

    assert errors.MutationGap is MutationGap and errors.RindleError is RindleError
    assert named.QueryRefused is QueryRefused and ast.QueryError is QueryError
    assert limits.LimitExceeded is LimitExceeded and quota.QuotaExceeded is QuotaExceeded
    assert statements.SqlError is SqlError and leases.LeaseExpired is exc_module.LeaseExpired
    assert producers.ProducerGap is exc_module.ProducerGap
    assert sources.SourceFenced is exc_module.SourceFenced
    assert journal.MigrationConflict is exc_module.MigrationConflict
    assert migration_sql.MigrationRefused is exc_module.MigrationRefused
    assert mutations.MutationRejected is exc_module.MutationRejected
    assert RowConflict is exc_module.RowConflict


def test_query_refused_and_query_error_are_rindle_errors():
    """Both keep their constructors and attributes, and a QueryRefused's status is its code's."""
    refused = QueryRefused("no such query", "unknown_query")
    assert isinstance(refused, RindleError)
    assert (refused.message, refused.code, refused.status) == (
        "no such query",
        "unknown_query",
        404,
    )
    assert QueryRefused("x", "unauthorized").status == 403
    assert LimitExceeded("x", "too_many_subscriptions").retryable is False
    error = QueryError("bad", code="unsupported", path="$.where")
    assert isinstance(error, RindleError) and isinstance(error, ValueError)
    assert (str(error), error.message, error.code, error.path) == (
        "$.where: bad",
        "bad",
        "unsupported",
        "$.where",
    )
    assert error.as_dict() == {"code": "unsupported", "message": "$.where: bad", "path": "$.where"}


def test_to_frame_builds_both_frame_kinds():
    """An error frame and a queryError frame have the protocol's keys, in its order."""
    gap = MutationGap("c1", 5, 2)
    text = to_frame(gap, kind=FRAME_ERROR, mid=5, lmid=2)
    assert text == (
        '{"t":"error","message":"client \'c1\' sent mutation 5 but the next expected is 3",'
        '"code":"mid_gap","mid":5,"lmid":2}'
    )
    assert CODES[MID_GAP].frames[0] == FRAME_ERROR
    assert json.loads(to_frame(gap)) == json.loads(text.replace(',"mid":5,"lmid":2', ""))
    quota = QuotaExceeded("over", retry_after_ms=1500)
    assert to_frame(quota, 7, kind=FRAME_QUERY_ERROR, retry_after_ms=1500) == (
        '{"t":"queryError","queryId":7,"message":"over","code":"quota_exceeded",'
        '"retryable":true,"retryAfterMs":1500}'
    )
    refused = QueryRefused("no", "unknown_query")
    assert json.loads(to_frame(refused, 3)) == {
        "t": "queryError",
        "queryId": 3,
        "message": "no",
        "code": "unknown_query",
        "retryable": False,
    }


def test_to_response_maps_each_kind_of_error():
    """Status, envelope and headers of the errors the HTTP routes answer."""
    gap = to_response(MutationGap("c1", 5, 2))
    assert gap.status_code == 409
    assert gap.data["error"]["message"].startswith("mutation gap: ")
    assert gap.data["error"]["lmid"] == 2
    busy = to_response(Unavailable("busy"))
    assert (busy.status_code, busy["Retry-After"]) == (503, "1")
    assert busy.data["error"]["retryable"] is True
    over = to_response(QuotaExceeded("over", retry_after_ms=1500))
    assert (over.status_code, over["Retry-After"]) == (429, "2")
    assert to_response(QueryRefused("no", "unknown_query")).data == {
        "error": {"code": "unknown_query", "message": "no"}
    }
    assert to_response(QueryError("bad")).status_code == 500
    sql = to_response(SqlError("nope", code="READ_FORBIDDEN", status=403))
    assert sql.status_code == 403
    assert sql.data["error"]["statement_index"] is None  # the SQL envelope keeps every field
    plain = to_response(RindleError("x", code="invalid_row", table=None, field="a"))
    assert plain.data == {
        "error": {"code": "invalid_row", "message": "x", "retryable": False, "field": "a"}
    }


def test_no_error_code_literal_is_left_in_rindle_app():
    """Code passes error codes by constant: a ``code="..."`` literal means a code off the table."""
    pattern = re.compile(r"\bcode\s?=\s?[\"'][A-Za-z_]+[\"']")
    offenders = []
    for path in (ROOT / "rindle_app").rglob("*.py"):
        if path.name == "exceptions.py" or "migrations" in path.parts:
            continue
        for n, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
            if pattern.search(line) and "``" not in line:
                offenders.append(f"{path.relative_to(ROOT)}:{n}")
    assert offenders == []
