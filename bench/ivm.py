#!/usr/bin/env python
"""
Incremental view maintenance (IVM) against re-querying, on the workloads of the
research note ``ivm-anchors.md`` §6, scaled down for a 2-core machine.

    .venv/bin/python bench/ivm.py [--quick] [--only w1,w2,ui,mem] [--profile] [--seed N]

One run, one fresh database: a temporary SQLite file, set as DATABASE_URL before
``django.setup()``, migrated in this process, deleted afterwards. The engine is
started with ``rindle_app.engine.get_engine()`` and every workload table is created
with ``engine.register_table(...)``, so its capture triggers feed the outbox like any
synced table. See bench/README.md ("bench/ivm.py").

Workloads (sizes are printed with the results):

- **W1**, top-k family: ``post WHERE board = ? ORDER BY score DESC LIMIT 20`` bound
  for 150 of 200 boards, 1,000 subscribers; a script of single-row commits (score
  updates, inserts into and out of the top range, deletes incl. the bound row,
  edits across the bound) then a tail of multi-row batch commits.
- **W2**, issue list: ``w2_issue WHERE project_id = ? AND closed = false AND
  EXISTS(label name = 'bug') ORDER BY updated_at DESC LIMIT 50`` with ``one(author)``,
  ``comments ORDER BY created_at DESC LIMIT 3`` and ``count(comments)``; a mixed
  script (comments, labels, bumps, close/reopen, renames, new issues).
- **UI**, the original's "realistic UI views" over the demo tables (issue, user,
  comment): median ms per add+remove pair for six views.
- **MEM**: tracemalloc bytes per idle shared query and per attached subscriber.

Variants of W1 and W2, each from the same restored seed state, on the same script:

- **L** (commit-only limit): the script through ``engine.write``, nothing maintained.
- **IVM**: ``engine.write`` then ``LiveQueries.poll()`` after EVERY commit (the outbox
  read plus ``Catalog.commit``), then the fan-out: the ops of each changed query
  are JSON-encoded once and counted as delivered to each of its subscribers.
- **IVM, poll/10**: the same, but polling (and fanning out) after every 10th commit.
- **IVM through the hub**, as ``realtime.hub.Hub`` runs it on SQLite: the commit
  listener runs the step (poll + fan-out) on the committing thread when the hub's
  lock is free, else wakes a hub thread; **every step on the hub thread** is the
  same with the thread woken for every commit.
- **IVM in a second process** (bench/ivm_follower.py): the views are kept by a
  process that makes none of the writes, tailing the outbox every ``POLL_INTERVAL``
  as a Daphne process does, while this process commits back to back as in L.
- **Inline floor** (W1 only): a hand-written W1-only pipeline on the writing thread
  (json.loads, bisect, json.dumps), no rindle IVM code: the least any Python IVM on
  that thread could cost.
- **B1**: after each commit, every subscriber re-runs its query in plain SQL (Django
  cursor) and diffs it with its last result; capped to a prefix of the script.
- **B2**: the same once per distinct (family, binding), fanned out to its subscribers.

After every IVM run the CORRECTNESS GATE compares every maintained view with (a) the
reference evaluator over a fresh snapshot read from the database, (b) a hand-written
SQL re-query, and (c, on a sample) ``evaluate(query, rows, schema)`` over the store
rows; it also checks the store against the database and each view's footprint. A
first, untimed "checked pass" of the IVM also compares the touched views with SQL
after every commit and replays each view's ops into a client replica. A failed gate
prints loudly and the exit status is 3; targets only print PASS/FAIL (exit 0).

The parts live beside this entry point: ``ivm_base`` (sizes, targets, command line),
``ivm_family`` with ``ivm_variants``, ``ivm_checks`` and ``ivm_summary`` (the W1/W2
machinery), ``ivm_w1``/``ivm_w2`` with their ``*_script`` modules, ``ivm_ui``,
``ivm_memory``, ``ivm_report`` and ``ivm_main``. The oracle the gate compares with is
``rindle_app.testing.reference_view``, shared with the tests.
"""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.ivm_main import main  # noqa: E402  (the checkout root is on sys.path first)

if __name__ == "__main__":
    sys.exit(main())
