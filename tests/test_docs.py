"""The documentation: generated pages current, links, paths, commands and imports right."""

import importlib
import importlib.util
import re
import shlex
from pathlib import Path

import pytest
from django.core.management import CommandError, call_command, get_commands, load_command_class

from rindle_app.conf import DEFAULTS
from rindle_app.management.commands.rindle_docs import (
    REFERENCE_DIR,
    render_checks,
    render_settings,
)

ROOT = Path(__file__).resolve().parents[1]
PAGES = [ROOT / "README.md", ROOT / "CONTRIBUTING.md", *sorted((ROOT / "docs").rglob("*.md"))]
# Written by the error-vocabulary work from rindle_app.exceptions; linked before it lands.
GENERATED_ELSEWHERE = set()
# Where the benchmarks write their results (git-ignored): the pages name files in it.
OUTPUT_DIRS = ("bench/results/",)

FENCE = re.compile(r"^```[^\n]*\n(.*?)^```", re.S | re.M)
LINK = re.compile(r"\[[^\]]*\]\(([^)\s]+)\)")
REPO_PATH = re.compile(r"^(?:rindle_app|tests|bench|scripts|project|templates|docs)/[\w./*-]+$")


def _page_id(page):
    return str(page.relative_to(ROOT))


def _code(text):
    """Every line of code a page shows: fenced blocks line by line, inline spans whole."""
    blocks = FENCE.findall(text)
    prose = FENCE.sub("", text)
    lines = [line for block in blocks for line in block.splitlines()]
    return lines + [" ".join(span.split()) for span in re.findall(r"`([^`]+)`", prose)]


def _slug(heading):
    # GitHub's anchor for a heading: lower case, punctuation dropped, spaces to dashes.
    return re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")


def _anchors(path):
    text = FENCE.sub("", path.read_text(encoding="utf-8"))
    return {_slug(h) for h in re.findall(r"^#+ (.+)$", text, re.M)}


def test_settings_page_is_current():
    """docs/reference/settings.md is what rindle_docs generates from conf.py today."""
    assert (ROOT / REFERENCE_DIR / "settings.md").read_text(encoding="utf-8") == render_settings()


def test_checks_page_is_current():
    """docs/reference/checks.md is what rindle_docs generates from checks.py today."""
    assert (ROOT / REFERENCE_DIR / "checks.md").read_text(encoding="utf-8") == render_checks()


def test_every_setting_has_a_row_with_its_default():
    """Each RINDLE key appears in the settings page's table with its default."""
    rows = {}
    for line in (ROOT / REFERENCE_DIR / "settings.md").read_text(encoding="utf-8").splitlines():
        cells = [c.strip() for c in line.split(" | ")]
        if line.startswith("| `") and len(cells) >= 3:
            keys = re.findall(r"`(\w+)`", cells[0])
            defaults = re.findall(r"`([^`]+)`", cells[1])
            rows.update(zip(keys, defaults, strict=True))
    assert set(rows) == set(DEFAULTS)
    assert rows["LEASE_TTL"] == "300" and rows["DATABASE"] == '"default"'


def test_every_check_id_is_documented():
    """Every rindle check id the checks module can emit has a row in checks.md."""
    source = (ROOT / "rindle_app" / "checks.py").read_text(encoding="utf-8")
    page = (ROOT / REFERENCE_DIR / "checks.md").read_text(encoding="utf-8")
    ids = set(re.findall(r'id="(rindle\.[EW]\d{3})"', source))
    assert ids and all(f"| `{i}` |" in page for i in ids)


def test_rindle_docs_check_fails_on_a_stale_page(tmp_path):
    """`rindle_docs --check` fails while a page differs, and the plain run fixes it."""
    call_command("rindle_docs", output_dir=str(tmp_path))
    (tmp_path / "settings.md").write_text("stale\n", encoding="utf-8")
    with pytest.raises(CommandError, match="settings.md"):
        call_command("rindle_docs", "--check", output_dir=str(tmp_path))
    call_command("rindle_docs", output_dir=str(tmp_path))
    call_command("rindle_docs", "--check", output_dir=str(tmp_path))
    assert (tmp_path / "settings.md").read_text(encoding="utf-8") == render_settings()


@pytest.mark.parametrize("page", PAGES, ids=_page_id)
def test_links_resolve(page):
    """Every relative link of a page names a file that exists, and a heading in it."""
    broken = []
    for target in LINK.findall(page.read_text(encoding="utf-8")):
        if re.match(r"^[a-z]+:", target):
            continue
        path, _, anchor = target.partition("#")
        file = (page.parent / path).resolve() if path else page
        if not file.exists():
            if file not in GENERATED_ELSEWHERE:
                broken.append(target)
        elif anchor and anchor not in _anchors(file):
            broken.append(target)
    assert broken == []


@pytest.mark.parametrize("page", PAGES, ids=_page_id)
def test_repository_paths_exist(page):
    """Every repository path a page quotes (`bench/ws.py`, `tests/...`) exists."""
    missing = []
    for code in _code(page.read_text(encoding="utf-8")):
        for word in code.split():
            word = word.rstrip(".,;:)")
            if word.startswith(OUTPUT_DIRS):
                continue
            if REPO_PATH.match(word) and not list(ROOT.glob(word.rstrip("/"))):
                if ROOT / word not in GENERATED_ELSEWHERE:
                    missing.append(word)
    assert missing == []


@pytest.mark.parametrize("page", PAGES, ids=_page_id)
def test_manage_py_commands_parse(page):
    """Every `manage.py <command> ...` a page shows is a command that accepts those args."""
    commands = get_commands()
    bad = []
    for code in _code(page.read_text(encoding="utf-8")):
        for match in re.finditer(r"manage\.py ([a-z_]+)([^|&;]*)", code):
            name = match.group(1)
            if name not in commands:
                bad.append(name)
                continue
            args = shlex.split(match.group(2), comments=True)
            if not args:
                continue  # the command named in prose, not a command line
            parser = load_command_class(commands[name], name).create_parser("manage.py", name)
            try:
                parser.parse_args(args)
            except CommandError as exc:
                bad.append(f"{match.group(0)}: {exc}")
    assert bad == []


@pytest.mark.parametrize("page", PAGES, ids=_page_id)
def test_make_targets_exist(page):
    """Every `make <target>` a page shows is a target of the Makefile."""
    makefile = (ROOT / "Makefile").read_text(encoding="utf-8")
    targets = set(re.findall(r"^([\w-]+):", makefile, re.M))
    shown = {
        m.group(1)
        for code in _code(page.read_text(encoding="utf-8"))
        for m in re.finditer(r"(?:^|\s)make ([a-z][\w-]*)", code)
    }
    assert shown - targets == set()


def _exports(module, name):
    """Whether ``from module import name`` works: an attribute or a submodule."""
    if hasattr(module, name):
        return True
    if not hasattr(module, "__path__"):
        return False
    return importlib.util.find_spec(f"{module.__name__}.{name}") is not None


@pytest.mark.parametrize("page", PAGES, ids=_page_id)
def test_python_imports_resolve(page):
    """Every `from rindle_app... import names` and `import rindle_app...` a page shows works."""
    missing, pending = [], []
    for code in _code(page.read_text(encoding="utf-8")):
        match = re.match(
            r"\s*(?:from (rindle_app[\w.]*) import ([\w, ]+)|import (rindle_app[\w.]*))", code
        )
        if not match:
            continue
        module_name = match.group(1) or match.group(3)
        if importlib.util.find_spec(module_name) is None:
            pending.append(module_name)
            continue
        module = importlib.import_module(module_name)
        names = [n.strip() for n in (match.group(2) or "").split(",") if n.strip()]
        missing += [f"{module_name}.{n}" for n in names if not _exports(module, n)]
    assert missing == []
    if pending:
        # The public API modules arrive from a parallel branch; once they exist, their
        # names are checked like any other.
        pytest.skip(f"not in this tree yet: {sorted(set(pending))}")
