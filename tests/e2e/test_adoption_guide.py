"""
The adoption guide, applied literally to a brand-new project: if the guide and the code
disagree, this test fails.

It runs ``django-admin startproject mysite`` and ``startapp shop`` in a temp dir, then
applies the code blocks of the "Setup" section of docs/guide.md by the file each one
names on its first line. The convention, which reads as a plain comment to a person:

- ``# mysite/settings.py: append`` (Python) adds the block to the end of that file;
- ``# shop/models.py`` (Python) or ``{# shop/templates/shop/orders.html #}`` (a Django
  template comment) is the whole file, written as is (the marker line included);
- a block without such a first line (the ``sh`` blocks) is not applied. The commands
  this test runs must appear in those blocks as written, and the ``curl`` request is
  sent with the body the guide gives.

Paths are relative to the directory holding ``manage.py``. Then ``makemigrations shop``,
``migrate``, ``check --database default --fail-level WARNING``, ``createsuperuser`` and
the guide's ``rindle_token_create`` run, and
``manage.py runserver`` (Daphne) serves the project on a free port. Chromium signs in
through the admin's login and opens the guide's orders page, which subscribes to the
guide's two named queries with ``rindle.js``. The guide's ``curl`` mutation (placeOrder,
over HTTP with the bearer token) must then appear on the page without a reload, and
the page's own form (placeOrder) and Close button (closeOrder, over the websocket) must
update both lists. The guide's Celery beat schedule must name tasks the project's Celery
app registers.

The project runs on rindle as the guide's step 1 installs it: the checkout's wheel
``pip install``-ed into a fresh venv (``installed_rindle``, built once per session),
whose python runs every command, so the checkout's ``project``, ``tests`` and ``bench``
are not importable. With DATABASE_URL naming PostgreSQL (the
suite's second pass), the project runs on a fresh database of its own on that server,
through the guide's ``DATABASE_URL`` line; otherwise on the guide's SQLite settings.
"""

import json
import os
import re
import shlex
import subprocess
import time
import urllib.error
import urllib.request
from contextlib import contextmanager
from pathlib import Path
from urllib.parse import urlparse, urlunparse

import pytest

from tests.e2e.browser.chromium import CHROMIUM, CHROMIUM_ARGS, sync_playwright_or_skip
from tests.support.processes import free_port, stop

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[2]
GUIDE = ROOT / "docs" / "guide.md"
ARTIFACTS = Path(__file__).parent / "browser" / "artifacts"
BOOT_TIMEOUT = 60
LIVE_MS = 10_000
ADMIN = ("admin", "a-long-password-for-the-guide-test")

BLOCK = re.compile(r"^```(\w*)\n(.*?)^```\n", re.S | re.M)
PY_TARGET = re.compile(r"^# ([\w./-]+\.py)(: append)?$")
HTML_TARGET = re.compile(r"^\{# ([\w./-]+) #\}$")


def setup_section():
    text = GUIDE.read_text()
    start = text.index("\n## Setup\n")
    return text[start : text.index("\n## ", start + 1)]


def guide_blocks():
    """``(files, shell)``: ``[(path, append, text)]`` in guide order, and the sh text."""
    files, shell = [], []
    for lang, body in BLOCK.findall(setup_section()):
        first = body.split("\n", 1)[0]
        target = PY_TARGET.match(first) if lang == "python" else None
        if lang == "html":
            target = HTML_TARGET.match(first)
        if target:
            files.append((target.group(1), lang == "python" and bool(target.group(2)), body))
        elif lang == "sh":
            shell.append(body)
        else:
            pytest.fail(f"a {lang} block of the guide's Setup names no file: {first!r}")
    return files, "\n".join(shell)


def guide_command(shell, prefix):
    """The one command of the guide's sh blocks that starts with ``prefix``, as argv."""
    lines = shell.replace("\\\n", " ").splitlines()
    found = [shlex.split(line) for line in lines if line.strip().startswith(prefix)]
    assert len(found) == 1, f"the guide's Setup runs {prefix!r} {len(found)} times, not once"
    return found[0]


def installed_env(installed):
    """``(python, env)`` that run the new project on the venv rindle was installed in."""
    env = {k: v for k, v in os.environ.items() if k in ("PATH", "HOME", "LANG", "TMPDIR")}
    env["PATH"] = f"{installed.venv / 'bin'}{os.pathsep}{env.get('PATH', '')}"
    return str(installed.python), env


@contextmanager
def project_database():
    """The DATABASE_URL the project runs on: None (SQLite), or a fresh PostgreSQL database."""
    url = os.environ.get("DATABASE_URL", "")
    if not url.startswith(("postgres://", "postgresql://")):
        yield None
        return
    import psycopg

    name = f"rindle_adoption_{os.getpid()}"
    with psycopg.connect(url, autocommit=True) as admin:
        admin.execute(f'DROP DATABASE IF EXISTS "{name}"')
        admin.execute(f'CREATE DATABASE "{name}"')
    try:
        yield urlunparse(urlparse(url)._replace(path="/" + name))
    finally:
        with psycopg.connect(url, autocommit=True) as admin:
            admin.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


class Project:
    """The new project in ``root``: its manage.py commands and its server."""

    def __init__(self, root, python, env):
        self.root, self.python, self.env = root, python, env

    def run(self, *argv, **env):
        argv = [self.python, *argv]
        done = subprocess.run(
            argv, cwd=self.root, env={**self.env, **env}, capture_output=True, text=True
        )
        assert done.returncode == 0, f"{shlex.join(argv[1:])} failed:\n{done.stdout}{done.stderr}"
        return done.stdout

    def manage(self, *args, **env):
        return self.run("manage.py", *args, **env)

    def log(self):
        return self.log_path.read_text()

    @contextmanager
    def server(self, log_path):
        """``manage.py runserver`` (Daphne) on a free port; yields its base URL once it answers."""
        self.log_path = log_path
        base = f"http://127.0.0.1:{free_port()}"
        with open(log_path, "w") as log:
            proc = subprocess.Popen(
                [self.python, "manage.py", "runserver", "--noreload", base.split("//")[1]],
                cwd=self.root,
                env=self.env,
                stdout=log,
                stderr=subprocess.STDOUT,
            )
        try:
            deadline = time.monotonic() + BOOT_TIMEOUT
            while True:
                if proc.poll() is not None:
                    pytest.fail(f"runserver exited with {proc.returncode}:\n{log_path.read_text()}")
                try:
                    with urllib.request.urlopen(base + "/healthz", timeout=2):
                        break
                except OSError:
                    if time.monotonic() > deadline:
                        pytest.fail(f"runserver did not answer:\n{log_path.read_text()[-3000:]}")
                    time.sleep(0.2)
            yield base
        finally:
            stop(proc, 10)


def post_json(url, body, token):
    request = urllib.request.Request(
        url,
        data=json.dumps(body).encode(),
        headers={"Authorization": f"Bearer {token}", "Content-Type": "application/json"},
    )
    try:
        with urllib.request.urlopen(request, timeout=10) as response:
            return response.status, json.loads(response.read())
    except urllib.error.HTTPError as exc:
        return exc.code, json.loads(exc.read() or b"null")


def build(tmp_path, database_url, installed):
    """startproject + startapp, then every file block of the guide's Setup, in order."""
    python, env = installed_env(installed)
    if database_url:
        env["DATABASE_URL"] = database_url
    files, shell = guide_blocks()
    for command in ("django-admin startproject mysite", "python manage.py startapp shop"):
        assert command in shell, f"the guide's Setup no longer says {command!r}"
    subprocess.run(
        [python, "-m", "django", "startproject", "mysite"], cwd=tmp_path, env=env, check=True
    )
    project = Project(tmp_path / "mysite", python, env)
    leaks = project.run(
        "-c",
        "import importlib.util as u\n"
        "print(*[m for m in ('project', 'tests', 'bench') if u.find_spec(m)])",
    )
    assert leaks.strip() == "", f"the new project can import the checkout's {leaks}"
    project.manage("startapp", "shop")
    for path, append, text in files:
        target = project.root / path
        if append:
            assert target.exists(), f"the guide appends to {path}, which startproject lacks"
            target.write_text(target.read_text() + "\n\n" + text)
        else:
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_text(text)
    return project, shell


def test_the_guide_builds_a_live_project(tmp_path, installed_rindle):
    sync_playwright = sync_playwright_or_skip()
    ARTIFACTS.mkdir(exist_ok=True)
    with project_database() as database_url:
        project, shell = build(tmp_path, database_url, installed_rindle)
        for command in (
            "python manage.py makemigrations shop",
            "python manage.py migrate",
            "python manage.py createsuperuser",
            "python manage.py runserver",
        ):
            assert command in shell, f"the guide's Setup no longer says {command!r}"
        project.manage("makemigrations", "shop")
        project.manage("migrate", "--noinput")
        # Every system check passes, warnings and database checks included (an unknown
        # RINDLE key, a SQLite database without IMMEDIATE, a missing SQL sandbox role).
        project.manage("check", "--database", "default", "--fail-level", "WARNING")
        username, password = ADMIN
        project.manage(
            "createsuperuser",
            "--noinput",
            "--email",
            "admin@example.com",
            DJANGO_SUPERUSER_USERNAME=username,
            DJANGO_SUPERUSER_PASSWORD=password,
        )
        token_argv = guide_command(shell, "python manage.py rindle_token_create")
        token = project.run(*token_argv[1:]).strip()
        assert token.startswith("rdl_"), token

        # The guide's beat schedule names tasks its Celery app registers.
        registered = project.run(
            "-c",
            "import json, django; django.setup()\n"
            "from django.conf import settings\n"
            "from mysite import celery_app\n"
            "celery_app.loader.import_default_modules()\n"
            "names = [e['task'] for e in settings.CELERY_BEAT_SCHEDULE.values()]\n"
            "print(json.dumps({n: n in celery_app.tasks for n in names}))",
            DJANGO_SETTINGS_MODULE="mysite.settings",
        )
        scheduled = json.loads(registered.splitlines()[-1])
        assert len(scheduled) == 3 and all(scheduled.values()), scheduled

        curl = guide_command(shell, "curl")
        mutate_url = urlparse(curl[curl.index("-X") + 2])
        body = json.loads(curl[curl.index("-d") + 1])
        args = body["envelope"]["args"]

        with project.server(ARTIFACTS / "adoption-server.log") as base:
            with urllib.request.urlopen(base + "/api/schema/openapi", timeout=10) as response:
                assert response.status == 200  # drf-spectacular as the guide configures it
            with sync_playwright() as playwright:
                browser = playwright.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
                try:
                    drive_the_page(browser, base, mutate_url.path, body, args, token)
                finally:
                    browser.close()


def drive_the_page(browser, base, mutate_path, body, args, token):
    page = browser.new_page()
    errors = []
    console = []
    page.on("pageerror", lambda exc: errors.append(str(exc)))
    page.on("console", lambda message: console.append(f"{message.type}: {message.text}"))
    page.on("dialog", lambda dialog: errors.append(f"alert: {dialog.message}") or dialog.dismiss())
    try:
        page.goto(base + "/orders/")  # login_required: the admin's login, then back
        page.fill("#id_username", ADMIN[0])
        page.fill("#id_password", ADMIN[1])
        page.click("input[type=submit]")
        page.wait_for_url(base + "/orders/")
        wait_text(page, "#open-count", "(0)")

        # The guide's curl: another principal's mutation over HTTP reaches the page live.
        status, outcome = post_json(base + mutate_path, body, token)
        assert status == 200, (status, outcome)
        assert (outcome["accepted"], outcome["rejected"], outcome["lmid"]) == (True, False, 1)
        order, (line,) = args["id"], args["lines"]
        recent = f"{args['customer']} (open): {line['quantity']} × {line['product']}"
        wait_text(page, f'#recent li[data-id="{order}"]', recent)
        wait_text(page, "#open-count", "(1)")

        # The same mid again is absorbed, not applied twice.
        status, outcome = post_json(base + mutate_path, body, token)
        assert status == 200 and outcome.get("duplicate") is True, (status, outcome)

        # The same id under the next mid is the mutator's own rejection, with its code.
        again = {"envelope": {**body["envelope"], "mid": body["envelope"]["mid"] + 1}}
        status, outcome = post_json(base + mutate_path, again, token)
        assert status == 200 and outcome["rejected"] is True, (status, outcome)
        assert outcome["code"] == "order_exists", outcome

        # The page's own form: placeOrder over the websocket, as the signed-in user.
        page.fill("#place [name=customer]", "Grace")
        page.fill("#place [name=product]", "coffee")
        page.click("#place button")
        wait_text(page, "#open-count", "(2)")
        page.locator("#recent li", has_text="Grace (open): 1 × coffee").wait_for(timeout=LIVE_MS)

        # Close the curl's order: it leaves the QuerySet list and shows closed in the other.
        page.click(f'#open li[data-id="{order}"] button')
        wait_text(page, "#open-count", "(1)")
        wait_text(page, f'#recent li[data-id="{order}"]', recent.replace("(open)", "(closed)"))
        assert page.locator(f'#open li[data-id="{order}"]').count() == 0
        assert page.inner_text("#problem") == ""
        assert errors == [], errors
    except Exception as exc:
        page.screenshot(path=str(ARTIFACTS / "adoption-orders.png"), full_page=True)
        log = (ARTIFACTS / "adoption-server.log").read_text()[-3000:]
        report = "\n".join([*errors, *console])
        pytest.fail(
            f"{exc}\n--- page:\n{page.inner_text('body')}\n--- console:\n{report}"
            f"\n--- server log:\n{log}"
        )


def wait_text(page, selector, text):
    """Wait until ``selector``'s text is exactly ``text`` (the page renders live)."""
    page.wait_for_function(
        "([selector, text]) => document.querySelector(selector)?.textContent.trim() === text",
        arg=[selector, text],
        timeout=LIVE_MS,
    )
