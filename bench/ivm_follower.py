#!/usr/bin/env python
"""
The "IVM in a second process" variant of bench/ivm.py: live queries kept by a
process that makes none of the writes, as a Daphne process keeps them while
other processes (web workers, management commands, another Daphne) write.

    .venv/bin/python -m bench.ivm_follower CONFIG.json   # started by bench/ivm.py

CONFIG names the database, the workload's tables, its family template, the
bindings and the subscribers. This process starts the engine, hydrates
``LiveQueries`` (no handoff: it writes nothing), binds the family, attaches the
subscribers and prints ``ready <version>``. Then it loops as ``realtime.hub.Hub``
does for other processes' commits on SQLite: ``LiveQueries.poll()`` reads the
outbox after the catalog's version and applies everything new as one step, the
ops of each changed query are JSON-encoded once, and it sleeps ``POLL_INTERVAL``.

The bench writes one line on stdin, the last commit version of its script. Once
the catalog reaches it, this process prints one JSON line and exits:
``ready`` [(version, perf_counter()) after each poll that applied commits; on
Linux that clock is the same in every process], ``messages``, ``polls``,
``busy`` (seconds spent in those polls) and ``views`` (per binding, the view's
result and footprint rows, for the bench's correctness gate).
"""

import json
import os
import select
import sys
import time
from pathlib import Path


def main(argv=None):
    argv = sys.argv[1:] if argv is None else argv
    config = json.loads(Path(argv[0]).read_text())
    os.environ["DATABASE_URL"] = config["database_url"]
    os.environ["DJANGO_SETTINGS_MODULE"] = "project.settings"
    os.environ["DJANGO_DEBUG"] = "0"
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
    import logging

    import django

    from bench.common import dumps

    django.setup()
    logging.getLogger("rindle").setLevel(logging.WARNING)
    from rindle_app.conf import rindle_settings
    from rindle_app.engine import get_engine
    from rindle_app.ivm.catalog import FamilyTemplate
    from rindle_app.ivm.live import LiveQueries

    engine = get_engine()
    for table in config["tables"]:
        engine.register_existing_table(table)
    live = LiveQueries(engine).start()
    template = FamilyTemplate(config["template"])
    keys = {b: live.catalog.bind(config["family"], template, b).key for b in config["bindings"]}
    for sub, b in config["subscribers"]:
        live.catalog.attach(keys[b], sub)
    queries = live.catalog.queries
    interval = float(rindle_settings.POLL_INTERVAL)
    perf = time.perf_counter
    print("ready", live.version, flush=True)

    last, ready, messages, busy = None, [], 0, 0.0
    while True:
        if last is None and select.select([sys.stdin], [], [], 0)[0]:
            last = int(sys.stdin.readline())
        t0 = perf()
        before = live.version
        version, outputs, faults = live.poll()
        for key, ops in outputs.items():
            dumps(ops)  # encoded once per changed query, as the hub does
            messages += len(queries[key].subscribers)
        t1 = perf()
        if faults:
            raise SystemExit(f"queries faulted: {faults}")
        if version > before:
            ready.append((version, t1))
            busy += t1 - t0
        if last is not None and version >= last:
            break
        time.sleep(interval)

    views = {
        json.dumps(b): {
            "result": queries[k].view.result(),
            "footprint": queries[k].view.footprint_rows(),
        }
        for b, k in keys.items()
    }
    report = {
        "ready": ready,
        "messages": messages,
        "polls": len(ready),
        "busy": busy,
        "poll_interval": interval,
        "version": live.version,
        "views": views,
    }
    print(dumps(report), flush=True)
    engine.close()


if __name__ == "__main__":
    main()
