"""
rindle installed as a user installs it: the wheel built from a copy of the checkout,
then ``pip install``-ed into a fresh venv (dependencies from the configured index).
Built once per test session (``tests/conftest.py``: ``installed_rindle``) for the
packaging test and the tested adoption guide.
"""

import shutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
# Left out of the copy the wheel is built from: the environments, caches and build output.
NOT_COPIED = shutil.ignore_patterns(
    ".venv", "node_modules", "__pycache__", ".git", "var", "build", "dist", "*.egg-info"
)


@dataclass(frozen=True)
class Installed:
    wheel: Path  # the built wheel
    venv: Path  # the fresh venv it is installed in
    python: Path  # that venv's interpreter


def run(args, cwd, env=None, timeout=120):
    return subprocess.run(
        args, cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout, check=False
    )


def build_and_install(workdir):
    """Build the wheel of a copy of the checkout and install it into a fresh venv."""
    src = workdir / "src"
    shutil.copytree(ROOT, src, ignore=NOT_COPIED, symlinks=False)
    built = run(
        [sys.executable, "-m", "pip", "wheel", "--no-deps", "-q", "-w", str(workdir), "."], src
    )
    assert built.returncode == 0, built.stdout + built.stderr
    (wheel,) = workdir.glob("rindle_app-*.whl")
    venv = workdir / "venv"
    made = run([sys.executable, "-m", "venv", str(venv)], workdir)
    assert made.returncode == 0, made.stderr
    python = venv / "bin" / "python"
    installed = run(
        [str(python), "-m", "pip", "install", "-q", "--no-compile", str(wheel)],
        workdir,
        timeout=300,
    )
    assert installed.returncode == 0, installed.stdout + installed.stderr
    return Installed(wheel, venv, python)
