"""
A serving process in miniature: counts one transfer through a meter (which starts
the ledger, its flush tick and the exit flush), then exits normally or is killed.

    python -m tests.flow_wiring.flow_child <namespace> exit|kill
"""

import os
import signal
import sys

import django

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "project.settings")
django.setup()

from rindle_app.flow import quota  # noqa: E402

namespace, how = sys.argv[1], sys.argv[2]
quota.meter(namespace, session="child").transfer(bytes_in=7, bytes_out=11)
print("counted", flush=True)
if how == "kill":
    os.kill(os.getpid(), signal.SIGKILL)
