"""
A pruner killed (SIGKILL) at any moment leaves a consistent outbox: the rows that
went are exactly those below the horizon, because each batch deletes and raises the
horizon in one transaction. Both backends, the pruner in a subprocess.
"""

import random
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from ..conftest import child_env
from .retention_support import DAY, T0, add_events, assert_prefix_invariant, publish, read_state

pytestmark = pytest.mark.django_db(transaction=True)

CHILD = Path(__file__).with_name("retention_child.py")


def start_pruner(batch_size=20, pause=0.05):
    return subprocess.Popen(
        [sys.executable, str(CHILD), str(batch_size), str(pause), T0.isoformat()],
        env=child_env(),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


@pytest.mark.slow
def test_a_pruner_killed_mid_run_leaves_horizon_equal_to_the_first_row_kept():
    """
    Three pruners SIGKILLed at random moments (mostly inside a batch), then one run
    to the end: after every kill the outbox is the original rows from the horizon
    on, the horizon is the first row kept, and it is at most safe_seq + 1.
    """
    rng = random.Random(15)
    seqs = add_events([T0 - 30 * DAY] * 400 + [T0] * 5)
    publish()
    horizons = []
    for _ in range(3):
        child = start_pruner()
        line = child.stdout.readline()  # one committed batch at least
        assert line.startswith("BATCH"), child.stderr.read()
        time.sleep(rng.uniform(0.0, 0.2))
        child.send_signal(signal.SIGKILL)
        child.wait(10)
        st, _kept = assert_prefix_invariant(seqs)
        horizons.append(st.horizon)
    assert horizons == sorted(horizons) and horizons[0] > seqs[0]
    child = start_pruner(batch_size=100, pause=0)
    out, err = child.communicate(timeout=60)
    assert child.returncode == 0 and out.strip().endswith("DONE"), err
    st, kept = assert_prefix_invariant(seqs)
    assert kept == seqs[400:] and st.horizon == seqs[400]
    assert read_state().horizon == seqs[400]
