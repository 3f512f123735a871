"""The JavaScript unit tests of rindle.js, run by Node's built-in test runner."""

import re
import shutil
import subprocess
from pathlib import Path

import pytest

from tests.conftest import CI

ROOT = Path(__file__).resolve().parents[3]
JS_TESTS = Path(__file__).parent / "js"


def _node():
    node = shutil.which("node")
    problem = None
    if node is None:
        problem = "node is not installed"
    else:
        version = subprocess.run([node, "--version"], capture_output=True, text=True).stdout
        major = re.match(r"v(\d+)", version)
        if not major or int(major.group(1)) < 20:
            problem = f"node {version.strip()} is older than 20"
    if problem:
        if CI:
            pytest.fail(problem + " (CI=true)")
        pytest.skip(problem)
    return node


def test_rindle_js_passes_its_node_tests():
    """The fold, the sequencing rules and the mutation queue of rindle.js pass `node --test`."""
    node = _node()
    files = sorted(str(path.relative_to(ROOT)) for path in JS_TESTS.glob("*.test.mjs"))
    assert files, "no JS tests found"
    proc = subprocess.run(
        [node, "--test", *files], cwd=ROOT, capture_output=True, text=True, timeout=300
    )
    summary = re.findall(r"^# (tests|pass|fail) (\d+)$", proc.stdout, re.M)
    assert proc.returncode == 0, proc.stdout[-6000:] + proc.stderr[-2000:]
    counts = dict(summary)
    assert int(counts.get("fail", "1")) == 0 and int(counts.get("pass", "0")) > 0, summary
