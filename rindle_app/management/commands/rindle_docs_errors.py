"""
Write ``docs/reference/errors.md`` from ``rindle_app.exceptions.CODES``:
``python manage.py rindle_docs_errors`` (``--check`` fails when the file is stale).
"""

import inspect
from pathlib import Path

from django.core.management.base import BaseCommand, CommandError

from rindle_app import exceptions

# Relative to the current directory, like makemessages: run from the checkout's root. An
# installed rindle_app has no docs/ beside it.
DEFAULT_PATH = Path("docs", "reference", "errors.md")

_HEADER = """\
# Error codes

<!-- Generated from rindle_app/exceptions.py by `python manage.py rindle_docs_errors`.
     Do not edit by hand: change the table there and regenerate. -->

Every error rindle answers carries a stable, machine-readable `code`. Import the
constants and the classes from `rindle_app.exceptions` (for example
`from rindle_app.exceptions import MID_GAP, MutationGap`).

- Over HTTP an error is `{"error": {"code", "message", ...}}` with the status below
  (`rindle_app.exceptions.to_response`).
- Over the websocket it is an `error` frame `{t, message, code, queryId?, ...}` or, for
  one subscription, a `queryError` frame `{t, queryId, message, code, retryable,
  retryAfterMs?}` (`rindle_app.exceptions.to_frame`). "Frames" lists the frames a code
  travels in; an empty cell is an HTTP-only code.
- "Retryable" is the default: the same request may succeed later unchanged. Some
  errors say otherwise per instance (for example a lease refused on a socket).
- "Raised as" names the classes whose own code it is; any `RindleError` may carry
  another code of the table.
"""

_SQL_NOTE = """\
## Public SQL (`/v1/sql/*`)

The public SQL plane keeps the original's codes (UPPERCASE) and, by contract, a
richer envelope: `{"error": {"code", "message", "retryable", "retry_scope",
"transaction_state", "statement_index", "partial_results"}}`. Its constants are
prefixed `SQL_` (`SQL_RESULT_TOO_LARGE = "RESULT_TOO_LARGE"`); its errors are
`SqlError`, whose status may be set per instance.
"""


def _classes_by_code():
    found = {}
    for name, obj in vars(exceptions).items():
        if inspect.isclass(obj) and issubclass(obj, BaseException) and not name.startswith("_"):
            code = obj.__dict__.get("code")
            if isinstance(code, str):
                found.setdefault(code, []).append(name)
    return found


_KINDS = ("FRAME_ERROR", "FRAME_QUERY_ERROR")


def _constants():
    """code -> the name of its constant (the frame kinds share no name with a code)."""
    names = {}
    for name, value in vars(exceptions).items():
        if name.isupper() and name not in _KINDS and isinstance(value, str):
            names[value] = name
    return names


def _table(entries, constants, classes):
    rows = [
        "| Code | Constant | HTTP | Retryable | Frames | Raised as | Meaning |",
        "| --- | --- | --- | --- | --- | --- | --- |",
    ]
    for e in sorted(entries, key=lambda e: e.code):
        raised = ", ".join(f"`{c}`" for c in sorted(classes.get(e.code, ())))
        frames = ", ".join(f"`{f}`" for f in e.frames)
        rows.append(
            f"| `{e.code}` | `{constants[e.code]}` | {e.status} | "
            f"{'yes' if e.retryable else 'no'} | {frames} | {raised} | {e.doc} |"
        )
    return "\n".join(rows) + "\n"


def render():
    """The text of ``docs/reference/errors.md``."""
    constants, classes = _constants(), _classes_by_code()
    entries = list(exceptions.CODES.values())
    app = [e for e in entries if e.plane != "sql"]
    sql = [e for e in entries if e.plane == "sql"]
    return (
        f"{_HEADER}\n## The app, daemon and websocket planes\n\n"
        f"{_table(app, constants, classes)}\n{_SQL_NOTE}\n{_table(sql, constants, classes)}"
    )


class Command(BaseCommand):
    help = "Write docs/reference/errors.md from the error-code table of rindle_app.exceptions."
    requires_system_checks = []

    def add_arguments(self, parser):
        parser.add_argument(
            "--output", "-o", default=str(DEFAULT_PATH), help="default: docs/reference/errors.md"
        )
        parser.add_argument(
            "--check", action="store_true", help="only fail if the file is not current"
        )

    def handle(self, *args, **options):
        path = Path(options["output"])
        text = render()
        if options["check"]:
            if not path.exists() or path.read_text(encoding="utf-8") != text:
                raise CommandError(f"{path} is stale: run python manage.py rindle_docs_errors")
            return
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text, encoding="utf-8")
        self.stderr.write(f"Wrote {len(exceptions.CODES)} codes to {path}.")
