"""
What the benchmarks share: a fresh database with Django on it, the machine's state,
profiles, quantiles, and the results file.

Every bench script puts the checkout root on ``sys.path`` and imports this module as
``bench.common``; nothing here imports Django or rindle until a database is set up.
"""

import argparse
import io
import json
import os
import platform
import pstats
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from contextlib import contextmanager
from pathlib import Path
from urllib.parse import urlsplit, urlunsplit

ROOT = Path(__file__).resolve().parent.parent
RESULTS_DIR = ROOT / "bench" / "results"


class BenchError(RuntimeError):
    pass


# --- the database ------------------------------------------------------------------------


class BenchDatabase:
    """A fresh database for one run; ``url`` is what DATABASE_URL is set to."""

    def __init__(self, url):
        self.given = url
        self.tmpdir = None
        self.pg_admin_url = None
        self.pg_name = None
        self.backend = None
        self.url = None
        self.path = None
        self.fresh = True

    def create(self):
        if not self.given:
            self.backend = "sqlite"
            self.tmpdir = tempfile.mkdtemp(prefix="rindle-bench-")
            self.path = str(Path(self.tmpdir) / "bench.sqlite3")
            self.url = f"sqlite:///{self.path}"
            return self
        scheme = urlsplit(self.given).scheme
        if scheme.startswith("sqlite"):
            self.backend = "sqlite"
            self.url = self.given
            self.path = self.given.split(":///", 1)[-1]
            self.fresh = False
            return self
        if scheme not in ("postgres", "postgresql", "pgsql"):
            raise BenchError(f"unsupported database URL scheme {scheme!r}")
        import psycopg

        self.backend = "postgresql"
        parts = urlsplit(self.given)
        self.pg_admin_url = urlunsplit(("postgresql", *parts[1:]))
        self.pg_name = f"rindle_bench_{os.getpid()}"
        try:
            admin = psycopg.connect(self.pg_admin_url, autocommit=True)
        except psycopg.OperationalError:  # the named database may not exist: use the default
            self.pg_admin_url = urlunsplit(("postgresql", parts.netloc, "/postgres", "", ""))
            admin = psycopg.connect(self.pg_admin_url, autocommit=True)
        with admin as conn:
            conn.execute(f'DROP DATABASE IF EXISTS "{self.pg_name}"')
            conn.execute(f'CREATE DATABASE "{self.pg_name}"')
        self.url = urlunsplit((parts.scheme, parts.netloc, "/" + self.pg_name, parts.query, ""))
        return self

    def describe(self):
        if self.backend == "sqlite":
            path = self.path
            return f"{path} ({'fresh, ' if self.fresh else 'given, '}migrated in this process)"
        return f"{self.pg_name} on {urlsplit(self.given).hostname} (fresh, migrated, dropped after)"

    def drop(self):
        if self.tmpdir:
            shutil.rmtree(self.tmpdir, ignore_errors=True)
        if self.pg_name:
            import psycopg

            with psycopg.connect(self.pg_admin_url, autocommit=True) as conn:
                try:
                    conn.execute(f'DROP DATABASE IF EXISTS "{self.pg_name}" WITH (FORCE)')
                except psycopg.Error:  # before PostgreSQL 13
                    conn.execute(f'DROP DATABASE IF EXISTS "{self.pg_name}"')


def raw_connection(backend, settings_dict):
    """
    A connection of the raw driver to the bench database, no Django (the physical
    limit): sqlite3 in autocommit mode with the engine's writer pragmas (WAL, RINDLE
    ``SQLITE_SYNCHRONOUS``), or psycopg with transactions (autocommit off).
    """
    if backend == "sqlite":
        import sqlite3

        from rindle_app.conf import rindle_settings

        conn = sqlite3.connect(settings_dict["NAME"], isolation_level=None)
        conn.execute("PRAGMA journal_mode=WAL")
        conn.execute(f"PRAGMA synchronous={rindle_settings.SQLITE_SYNCHRONOUS}")
        conn.execute("PRAGMA busy_timeout=20000")
        return conn
    import psycopg

    return psycopg.connect(
        dbname=settings_dict["NAME"],
        user=settings_dict.get("USER") or None,
        password=settings_dict.get("PASSWORD") or None,
        host=settings_dict.get("HOST") or None,
        port=settings_dict.get("PORT") or None,
        autocommit=False,
    )


@contextmanager
def django_database(database_url, debug=False, quiet=False):
    """
    A fresh ``BenchDatabase`` with Django set up and migrated on it, for a benchmark
    that runs in this process; the engine is shut down and the database dropped on exit.
    ``quiet``: rindle logs warnings only (from before the migration on).
    """
    db = BenchDatabase(database_url).create()
    try:
        os.environ["DATABASE_URL"] = db.url
        os.environ.pop("RINDLE_TEST_DATABASE_NAME", None)
        os.environ["DJANGO_SETTINGS_MODULE"] = "project.settings"
        os.environ["DJANGO_DEBUG"] = "1" if debug else "0"
        sys.path.insert(0, str(ROOT))
        import django

        django.setup()
        if quiet:
            import logging

            logging.getLogger("rindle").setLevel(logging.WARNING)
        from django.core.management import call_command

        call_command("migrate", verbosity=0)
        yield db
    finally:
        stop_django()
        db.drop()


def stop_django():
    """Shut the engine down and close Django's connections, if Django was set up."""
    if "django" not in sys.modules:
        return
    try:
        from django.db import connections

        from rindle_app.engine import shutdown

        shutdown()
        connections.close_all()
    except Exception:  # tearing down after a failed run: the failure is what matters
        pass


# --- the machine and the checkout ----------------------------------------------------------


def environment(backend):
    from django import get_version
    from django.db import connection

    env = {
        "python": platform.python_version(),
        "django": get_version(),
        "platform": platform.platform(),
        "cpus": os.cpu_count(),
    }
    if backend == "sqlite":
        import sqlite3

        env["sqlite"] = sqlite3.sqlite_version
    else:
        with connection.cursor() as cursor:
            cursor.execute("SHOW server_version")
            env["postgres"] = cursor.fetchone()[0]
            for name in ("fsync", "synchronous_commit"):
                cursor.execute(f"SHOW {name}")
                env[f"postgres_{name}"] = cursor.fetchone()[0]
    env.update(git_state())
    env["loadavg_start"] = loadavg()
    return env


def git_state():
    """
    {git_commit, rindle_app_dirty} of the checkout being measured ({} outside git):
    uncommitted changes to the engine make the commit alone an incomplete label.
    """
    git = ["git", "-C", str(ROOT)]
    try:
        commit = subprocess.run(
            [*git, "rev-parse", "--short", "HEAD"], capture_output=True, text=True, check=True
        ).stdout.strip()
        dirty = subprocess.run(
            [*git, "status", "--porcelain", "--", "rindle_app"],
            capture_output=True,
            text=True,
            check=True,
        ).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return {}
    return {"git_commit": commit, "rindle_app_dirty": bool(dirty)}


def machine_busy():
    """(busy CPU seconds of the whole machine, monotonic time), from /proc/stat."""
    try:
        with open("/proc/stat") as f:
            fields = [int(x) for x in f.readline().split()[1:]]
    except (OSError, ValueError):
        return None
    idle = fields[3] + (fields[4] if len(fields) > 4 else 0)
    return (sum(fields[:8]) - idle) / os.sysconf("SC_CLK_TCK"), time.monotonic()


class CpuMeter:
    """CPUs kept busy by OTHER processes while the workloads ran (Linux /proc/stat)."""

    def __init__(self):
        self.start = self._sample()

    @staticmethod
    def _sample():
        machine = machine_busy()
        if machine is None:
            return None
        own = os.times()
        return machine[0], own.user + own.system, machine[1]

    def other_cpus(self):
        end = self._sample()
        if self.start is None or end is None or end[2] <= self.start[2]:
            return None
        busy = end[0] - self.start[0]
        own = end[1] - self.start[1]
        return round(max(0.0, busy - own) / (end[2] - self.start[2]), 2)


def loadavg():
    try:
        return round(os.getloadavg()[0], 2)
    except OSError:  # pragma: no cover - not on every platform
        return None


# --- figures ---------------------------------------------------------------------------------


def dumps(obj):
    """Compact JSON, as the hub encodes a frame."""
    return json.dumps(obj, separators=(",", ":"), default=str)


def median(values):
    return statistics.median(values) if values else None


def pct(values, q):
    """The q-quantile (0..1) of ``values`` by nearest rank."""
    if not values:
        return None
    s = sorted(values)
    return s[min(len(s) - 1, max(0, round(q * (len(s) - 1))))]


def rotated(keys, rep):
    """``keys`` rotated by ``rep``: each repeat runs the workloads in another order."""
    return keys[rep % len(keys) :] + keys[: rep % len(keys)]


def interleaved(keys, repeats, rate, unit="/s", label="repeat"):
    """
    ``{key: [rate, ...]}`` over ``repeats`` rounds, each round in another order
    (``rotated``), so a drift of the machine spreads over every workload alike.
    ``rate(key, tag)`` runs workload ``key`` once (``tag`` names the run) and returns
    its rate; each round prints one line. Warming up is the caller's.
    """
    samples = {key: [] for key in keys}
    for rep in range(repeats):
        order = rotated(keys, rep)
        for key in order:
            samples[key].append(rate(key, f"r{rep}-{key}"))
        print(
            f"{label} {rep + 1}/{repeats}: "
            + ", ".join(f"{k} {samples[k][-1]:,.0f}{unit}" for k in order),
            flush=True,
        )
    return samples


def top_functions(prof, limit=25, sort="tottime", header=True):
    """``pstats`` of ``prof``: the ``limit`` top functions by ``sort`` (header lines or not)."""
    out = io.StringIO()
    stats = pstats.Stats(prof, stream=out)
    stats.strip_dirs().sort_stats(sort).print_stats(limit)
    text = out.getvalue()
    if header:
        return text
    lines = text.splitlines()
    start = next((i for i, line in enumerate(lines) if "ncalls" in line), 0)
    return "\n".join(lines[start:])


def counts_parser(doc, counts):
    """
    The command line of a bench whose knobs are positive counts, described by the
    first paragraph of ``doc`` (the bench's module docstring): ``counts`` is
    ``[(name, default, help)]``, then ``--repeats``, ``--database-url`` and ``--json``.
    ``parse(argv)`` refuses a count below 1.
    """
    p = argparse.ArgumentParser(description=doc.split("\n\n")[0])
    for name, default, text in counts:
        p.add_argument(f"--{name}", type=int, default=default, help=text)
    p.add_argument("--repeats", type=int, default=5, help="runs of each workload (5)")
    p.add_argument("--database-url", default=None, help="as bench/mutations.py (default SQLite)")
    p.add_argument("--json", default=None, help="results file (default bench/results/...)")
    names = [name for name, _default, _text in counts] + ["repeats"]

    def parse(argv=None):
        args = p.parse_args(argv)
        if min(getattr(args, name) for name in names) < 1:
            p.error("every count must be >= 1")
        return args

    return parse


def pick_workloads(parser, only, keys):
    """The workloads of ``--only`` (comma-separated) in ``keys``' order; all when absent."""
    if not only:
        return list(keys)
    wanted = [w.strip() for w in only.split(",") if w.strip()]
    unknown = [w for w in wanted if w not in keys]
    if unknown:
        parser.error(f"unknown workload(s) {unknown}; choose from {list(keys)}")
    return [w for w in keys if w in wanted]


# --- the results file ---------------------------------------------------------------------------


def write_results(path, default_name, benchmark, backend, body, default=None):
    """
    Write ``body`` as the results JSON (``path``, or ``bench/results/<default_name>``)
    under the keys every bench starts with, and say where.
    """
    out = Path(path) if path else RESULTS_DIR / default_name
    out.parent.mkdir(parents=True, exist_ok=True)
    payload = {
        "benchmark": benchmark,
        "backend": backend,
        "created": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        **body,
    }
    out.write_text(json.dumps(payload, indent=2, default=default) + "\n")
    print(f"results written to {out.relative_to(ROOT) if out.is_relative_to(ROOT) else out}")
    return out
