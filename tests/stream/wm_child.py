"""
A watermarker in a process of its own, for the lease and fleet tests:
``python -m tests.stream.wm_child OWNER SECONDS [INSTALLATION_ID]``.

It runs ``Watermarker.run`` for SECONDS (0: until SIGTERM) and prints one JSON
line per step outcome: {"t": "step", "epoch", "safe_seq", "candidate", "advanced",
"timed_out"} or {"t": "standby"}, then {"t": "done"}. Database clock times come
from the published row, never from here.
"""

import json
import os
import signal
import sys
import threading
import time

import django


def main():
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "project.settings")
    django.setup()
    from rindle_app.stream import watermark

    owner, seconds = sys.argv[1], float(sys.argv[2])
    installation = sys.argv[3] if len(sys.argv) > 3 else None
    out = sys.stdout

    def observe(progress):
        out.write(
            json.dumps(
                {
                    "t": "step",
                    "epoch": wm.lease.epoch,
                    "safe_seq": progress.safe_seq,
                    "candidate": progress.candidate_seq,
                    "advanced": progress.advanced,
                    "timed_out": progress.fence_timed_out,
                    "at": time.monotonic(),
                }
            )
            + "\n"
        )
        out.flush()

    wm = watermark.Watermarker(
        refresh_interval=float(os.environ.get("WM_INTERVAL", "0.05")),
        lease_ttl=float(os.environ.get("WM_TTL", "5")),
        owner=owner,
        observer=observe,
        installation_id=installation,
    )
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    if seconds:
        threading.Timer(seconds, stop.set).start()
    out.write(json.dumps({"t": "ready", "at": time.monotonic()}) + "\n")
    out.flush()
    wm.run(stop)
    wm.close()
    out.write(json.dumps({"t": "done", "standby": wm.stats.standby_steps}) + "\n")
    out.flush()


if __name__ == "__main__":
    main()
