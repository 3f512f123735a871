"""
The usage ledger across real processes: concurrent flushes from two processes sum,
and a process killed with SIGKILL loses at most one tick and never double counts
after its restart with the same node id.
"""

import random
import subprocess
import time

import pytest

from rindle_app.flow import FlowLedger, FlowStore
from rindle_app.models import FlowDayRecord
from tests.conftest import child_env
from tests.support.processes import ROOT, command

from .conftest import NOON

pytestmark = pytest.mark.django_db(transaction=True)


def spawn(node, count, flush_every):
    return subprocess.Popen(
        command("flow_child", "ledger", node, count, flush_every, NOON),
        cwd=ROOT,
        env=child_env(),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def finish(proc, timeout=120):
    out, err = proc.communicate(timeout=timeout)
    assert proc.returncode == 0 and out.rstrip().endswith("DONE"), err[-2000:]
    return out


def stored_bytes_in(node=None):
    rows = FlowDayRecord.objects.filter(namespace="acme")
    if node is not None:
        rows = rows.filter(node=node)
    return sum(rows.values_list("bytes_in", flat=True))


def test_two_processes_flushing_concurrently_lose_nothing():
    count = 2000
    children = [spawn("proc-a", count, 100), spawn("proc-b", count, 70)]
    for child in children:
        finish(child)
    reader = FlowLedger(FlowStore(), node="reader", retention_days=30).start(NOON)
    day = reader.today("acme", NOON)
    assert (day.transfers, day.bytes_in, day.bytes_out) == (2 * count, 2 * count, 4 * count)
    assert day.sessions == 10
    assert stored_bytes_in("proc-a") == stored_bytes_in("proc-b") == count


def test_a_killed_process_loses_at_most_one_tick_and_its_restart_adds_on_top():
    rng = random.Random()
    flush_every, count = 50, 200_000
    child = spawn("web-1", count, flush_every)
    deadline = time.monotonic() + 60
    flushed = []
    while time.monotonic() < deadline:
        line = child.stdout.readline()
        if line.startswith("FLUSHED"):
            flushed.append(int(line.split()[1]))
            if len(flushed) >= rng.randint(3, 30):
                break
    child.kill()
    child.wait()
    # Lines printed before the kill but not read yet.
    flushed += [int(line.split()[1]) for line in child.stdout if line.startswith("FLUSHED")]
    assert flushed, child.stderr.read()[-2000:]
    # Whatever was committed is a whole flush: the last one reported or the one after.
    kept = stored_bytes_in("web-1")
    assert kept in (flushed[-1], flushed[-1] + flush_every)

    restart = spawn("web-1", 123, 1000)
    finish(restart)
    assert stored_bytes_in("web-1") == kept + 123
    assert FlowDayRecord.objects.filter(namespace="acme").count() == 1
