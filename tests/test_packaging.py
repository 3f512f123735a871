"""The distribution: a wheel of rindle_app alone that installs and runs in a fresh venv."""

import os
import re
import tomllib
import zipfile
from pathlib import Path

import pytest

from tests.support.installed import run

ROOT = Path(__file__).resolve().parents[1]
TINY_SETTINGS = """\
SECRET_KEY = "packaging-test-key-0123456789abcdefghijklmnopqrstuvwxyz"
INSTALLED_APPS = [
    "daphne",
    "django.contrib.auth",
    "django.contrib.contenttypes",
    "channels",
    "rest_framework",
    "rindle_app",
]
DATABASES = {
    "default": {
        "ENGINE": "django.db.backends.sqlite3",
        "NAME": "db.sqlite3",
        "OPTIONS": {
            "init_command": "PRAGMA journal_mode=WAL;PRAGMA synchronous=NORMAL",
            "transaction_mode": "IMMEDIATE",
        },
    }
}
CHANNEL_LAYERS = {"default": {"BACKEND": "channels.layers.InMemoryChannelLayer"}}
ROOT_URLCONF = "rindle_app.urls"
USE_TZ = True
"""


def _requirements(name):
    lines = (ROOT / name).read_text(encoding="utf-8").splitlines()
    return [line.strip() for line in lines if line.strip() and not line.startswith("#")]


def _pyproject():
    with open(ROOT / "pyproject.toml", "rb") as f:
        return tomllib.load(f)


def test_requirements_match_the_distributions_pins():
    """requirements.txt is the wheel's dependencies; requirements-test.txt adds the test extra."""
    project = _pyproject()["project"]
    assert _requirements("requirements.txt") == project["dependencies"]
    assert _requirements("requirements-test.txt") == [
        "-r requirements.txt",
        *project["optional-dependencies"]["test"],
    ]
    for pin in project["dependencies"] + project["optional-dependencies"]["test"]:
        assert re.fullmatch(r"[\w.-]+(\[\w+\])?==[\w.]+", pin), pin


@pytest.mark.slow
def test_the_wheel_installs_rindle_app_alone_and_it_runs(tmp_path, installed_rindle):
    """
    The wheel holds rindle_app (templates, static, migrations) and its dist-info only;
    installed in a fresh venv it imports and passes `django-admin check` outside the
    checkout, and the checkout's project, tests, bench and scripts are not importable.
    """
    installed = installed_rindle
    wheel, venv, python = installed.wheel, installed.venv, installed.python
    names = zipfile.ZipFile(wheel).namelist()
    tops = {name.split("/", 1)[0] for name in names}
    dist_info = {top for top in tops if top.endswith(".dist-info")}
    assert tops - dist_info == {"rindle_app"}
    assert [top.startswith("rindle_app-") for top in dist_info] == [True]
    for required in (
        "rindle_app/templates/admin/rindle_app/flow_base.html",
        "rindle_app/static/rindle/rindle.js",
        "rindle_app/migrations/0001_initial.py",
    ):
        assert required in names, required
    in_tree = {str(p.relative_to(ROOT)) for p in (ROOT / "rindle_app").rglob("*") if p.is_file()}
    shipped = {p for p in in_tree if "__pycache__" not in p}
    assert shipped <= set(names), sorted(shipped - set(names))

    site = tmp_path / "site"
    site.mkdir()
    (site / "tiny_settings.py").write_text(TINY_SETTINGS, encoding="utf-8")
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "DATABASE_URL")}
    env["DJANGO_SETTINGS_MODULE"] = "tiny_settings"
    env["PYTHONPATH"] = str(site)

    urls = run(
        [str(python), "-c", "import django; django.setup(); import rindle_app.urls"], site, env
    )
    assert urls.returncode == 0, urls.stderr
    for name in ("project", "tests", "bench", "scripts"):
        found = run([str(python), "-c", f"import {name}"], site, env)
        assert found.returncode == 1 and "ModuleNotFoundError" in found.stderr, name
    check = run([str(venv / "bin" / "django-admin"), "check"], site, env)
    assert check.returncode == 0, check.stdout + check.stderr
