"""
A process that writes with the plain Django ORM when told, run as
``python -m tests.support.write_child`` (``processes.Child(..., module="write_child",
interactive=True)``) with ``child_env()``: it never starts rindle's engine, so its
writes reach a serving process only through capture and the outbox. Prints
``STARTED``; then for each stdin line ``user ID NAME`` it saves that user (created
or renamed) with ``Model.save()`` in autocommit and prints ``WROTE ID <time.time()>``
once the save returned (committed); it exits at the end of its stdin.
"""

import sys
import time

from tests.support.children import boot, say

boot()

from project.demo.models import User  # noqa: E402


def main():
    say("STARTED")
    for line in sys.stdin:
        kind, pk, name = line.rstrip("\n").split(" ", 2)
        if kind != "user":
            raise SystemExit(f"unknown command {kind!r}")
        User(id=pk, name=name).save()
        say(f"WROTE {pk} {time.time()!r}")


if __name__ == "__main__":
    main()
