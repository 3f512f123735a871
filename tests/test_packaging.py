"""The distribution: a wheel of rindle_app alone that installs and runs in a fresh venv."""

import os
import re
import shutil
import subprocess
import sys
import tomllib
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
# Left out of the copy the wheel is built from: the environments, caches and build output.
NOT_COPIED = shutil.ignore_patterns(
    ".venv", "node_modules", "__pycache__", ".git", "var", "build", "dist", "*.egg-info"
)
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


def _run(args, cwd, env=None, timeout=120):
    return subprocess.run(
        args, cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout, check=False
    )


@pytest.mark.slow
def test_the_wheel_installs_rindle_app_alone_and_it_runs(tmp_path):
    """
    The wheel holds rindle_app (templates, static, migrations) and its dist-info only;
    installed in a fresh venv it imports and passes `django-admin check` outside the
    checkout, and the checkout's project, tests, bench and scripts are not importable.
    """
    src = tmp_path / "src"
    shutil.copytree(ROOT, src, ignore=NOT_COPIED, symlinks=False)
    built = _run(
        [sys.executable, "-m", "pip", "wheel", "--no-deps", "-q", "-w", str(tmp_path), "."], src
    )
    assert built.returncode == 0, built.stdout + built.stderr
    (wheel,) = tmp_path.glob("rindle_app-*.whl")

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

    venv = tmp_path / "venv"
    assert _run([sys.executable, "-m", "venv", str(venv)], tmp_path).returncode == 0
    python = venv / "bin" / "python"
    installed = _run(
        [str(python), "-m", "pip", "install", "-q", "--no-compile", str(wheel)],
        tmp_path,
        timeout=180,
    )
    assert installed.returncode == 0, installed.stdout + installed.stderr

    site = tmp_path / "site"
    site.mkdir()
    (site / "tiny_settings.py").write_text(TINY_SETTINGS, encoding="utf-8")
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "DATABASE_URL")}
    env["DJANGO_SETTINGS_MODULE"] = "tiny_settings"
    env["PYTHONPATH"] = str(site)

    urls = _run(
        [str(python), "-c", "import django; django.setup(); import rindle_app.urls"], site, env
    )
    assert urls.returncode == 0, urls.stderr
    for name in ("project", "tests", "bench", "scripts"):
        found = _run([str(python), "-c", f"import {name}"], site, env)
        assert found.returncode == 1 and "ModuleNotFoundError" in found.stderr, name
    check = _run([str(venv / "bin" / "django-admin"), "check"], site, env)
    assert check.returncode == 0, check.stdout + check.stderr
