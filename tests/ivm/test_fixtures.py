"""The conformance fixtures run through ``manage.py rindle_fixture``, and it can fail."""

import json
from io import StringIO
from pathlib import Path

import pytest
from django.core.management import call_command

HERE = Path(__file__).resolve().parent
# The original's recorded fixtures (Apache-2.0 data), kept in the repository so the
# suite never depends on where shared/ happens to be; test_conformance_copy checks
# the copy against ../shared when that is present.
CONFORMANCE = HERE.parent / "conformance" / "diff"
ORIGINAL = sorted(CONFORMANCE.glob("*.json"))
OURS = sorted((HERE / "fixtures").glob("*.json"))


def run(*files):
    out = StringIO()
    try:
        call_command("rindle_fixture", *map(str, files), stdout=out)
        status = 0
    except SystemExit as exc:
        status = exc.code
    return status, out.getvalue().splitlines()


def test_all_twenty_original_fixtures_pass():
    """Every recorded fixture of the original gives the recorded view."""
    assert len(ORIGINAL) == 20
    status, lines = run(*ORIGINAL)
    assert lines == [f"PASS {f.stem}" for f in ORIGINAL]
    assert status == 0


def test_our_own_fixtures_pass():
    """Fixtures we wrote in the same format (count, one, select, gates) pass too."""
    assert len(OURS) >= 3
    status, lines = run(*OURS)
    assert lines == [f"PASS {f.stem}" for f in OURS]
    assert status == 0


def test_a_wrong_expectation_fails_with_a_reason_and_exit_status_1(tmp_path):
    """A fixture whose expected view is wrong prints FAIL with where it differs."""
    fixture = json.loads(ORIGINAL[0].read_text())
    fixture["expected"]["data"].append({"id": 999})
    bad = tmp_path / "wrong.json"
    bad.write_text(json.dumps(fixture))
    status, lines = run(ORIGINAL[1], bad)
    assert status == 1
    assert lines[0].startswith("PASS ")
    assert lines[1].startswith("FAIL wrong: reference: data")


def test_the_incremental_view_is_checked_after_the_pushes(monkeypatch):
    """The runner diffs the maintained view too: a view that ignores pushes fails."""
    from rindle_app.ivm.view import View

    monkeypatch.setattr(View, "apply", lambda self, changes: [])
    pushes = [f for f in ORIGINAL if f.stem.startswith("push__")]
    status, lines = run(*pushes)
    assert status == 1
    assert any(line.startswith("FAIL ") and ": incremental: " in line for line in lines)


@pytest.mark.parametrize(
    "text, reason",
    [
        ("{", "unreadable fixture"),
        ('{"input": {"sources": {}, "ast": {"table": "x"}}}', "query refused"),
    ],
)
def test_a_broken_fixture_fails_cleanly(tmp_path, text, reason):
    """Malformed JSON or an unknown table is a FAIL line, never a crash."""
    bad = tmp_path / "broken.json"
    bad.write_text(text)
    status, lines = run(bad)
    assert status == 1
    assert lines[0].startswith(f"FAIL broken: {reason}")
