"""The ``RINDLE`` settings dict, read lazily with documented defaults."""

from django.conf import settings
from django.core.signals import setting_changed
from django.utils.module_loading import import_string

DEFAULTS = {
    # The database alias the engine writes through and captures on.
    "DATABASE": "default",
    # Models whose tables are synced: "app_label.ModelName" strings.
    "SYNCED_MODELS": [],
    # Dotted path of the RindleAdapter subclass (who the user is, what they may do).
    "ADAPTER": "rindle_app.adapter.RindleAdapter",
    # Module name looked up in every installed app for @mutator definitions.
    "MUTATORS_MODULE": "mutators",
    # Module name looked up in every installed app for @named_query definitions.
    "QUERIES_MODULE": "queries",
    # Largest accepted JSON encoding of a mutation's or a named query's args, in bytes.
    "MAX_ARGS_BYTES": 64 * 1024,
    # DRF permission classes (classes or dotted paths) every @mutator without its own
    # permission_classes is checked with, on every transport; a refusal is a
    # permission_denied rejection. Empty: every mutator may run (the adapter's
    # authorize_mutation still applies).
    "MUTATOR_PERMISSION_CLASSES": [],
    # Largest JSON encoding of a mutator's return value, in bytes: it travels back as
    # the HTTP mutate outcome's result; a larger (or non-JSON) one rejects the
    # mutation with mutation_result_invalid.
    "MAX_MUTATION_RESULT_BYTES": 4 * 1024,
    # Seconds a lease token minted by POST /api/rindle/query stays valid (it is
    # checked when a websocket subscribes with it).
    "LEASE_TTL": 300,
    # Most pinned materializations (the daemon plane's POST /materialize with
    # policy {kind: "pinned"}) one process keeps warm without subscribers; past it a
    # new pin is 409 too_many_pins (re-asserting a pin it holds is always accepted).
    "DAEMON_MAX_PINS": 64,
    # Most envelopes POST /api/rindle/mutate accepts in one request (the clients'
    # mutation queue sends at most 32 by default).
    "MAX_MUTATIONS_PER_REQUEST": 32,
    # Most row changes one producer write or change-source batch may carry (the
    # original's per-transaction ceiling).
    "MAX_BATCH_CHANGES": 8191,
    # The realtime lifecycle plane: room flushes co-commit the downgrade watermark
    # (_rindle_room_watermark) and the outcomes of mutations that were not applied
    # (_rindle_room_mutation_outcomes); the four lifecycle tables are captured and
    # subscribable, and a realtime-labelled query's lease writes its occupancy row and
    # carries the lifecycle streams. Off, outcome rows are accepted and discarded.
    "REALTIME_LIFECYCLE": True,
    # Outcome rows a room keeps per client, counted in mutation ids below its room
    # lmid: a flush that raises a client's lmid prunes that client's older outcomes.
    "ROOM_OUTCOME_RETENTION_LMIDS": 1000,
    # Seconds a labelled lease's occupancy row (_rindle_scope_sessions, the doorbell)
    # stays live, and seconds an expired one still counts (hysteresis); positive.
    "ROOM_SESSION_TTL": 300,
    "ROOM_SESSION_GRACE": 120,
    # Whether this process hosts rooms: a labelled query's lease is room-served (its
    # clients exchange mutations through /ws/rindle/room/) once ROOM_MIN_SESSIONS
    # clients lease its doc. A room lives in one process; in a fleet the others relay
    # its sockets there through a channel layer that reaches every process (Redis).
    "ROOMS_ENABLED": False,
    "ROOM_MIN_SESSIONS": 2,
    # A room flushes as soon as a mutation is pending (what arrives meanwhile goes in
    # the next flush); its flusher also wakes every this many seconds, to retry a
    # batch the database kept pending.
    "ROOM_FLUSH_INTERVAL": 0.05,
    # Mutations a room host (rindle_app.realtime.room_host) holds unflushed at most:
    # at the cap it flushes before it takes the next one, and refuses it (room_busy,
    # retryable) when that flush cannot clear the buffer.
    "ROOM_MAX_PENDING": 1000,
    # Requests the writer accepts before callers are told to back off.
    "WRITER_QUEUE_SIZE": 10_000,
    # Queued requests committed together (each in its own savepoint); 1 disables.
    "GROUP_COMMIT_MAX": 64,
    # Seconds a caller waits for its write before it is told to retry.
    "WRITE_TIMEOUT": 30.0,
    # SQLite durability of the writer connection (NORMAL is safe in WAL mode
    # against application crashes; FULL also against power loss).
    "SQLITE_SYNCHRONOUS": "NORMAL",
    # Milliseconds the writer waits on a SQLite lock held by another process.
    "SQLITE_BUSY_TIMEOUT_MS": 5000,
    # Seconds between outbox polls for writes made by other processes (this
    # process's own commits wake the live queries at once). Where a wake-up
    # mechanism runs (SQLITE_WAKE on SQLite, LISTEN on PostgreSQL) the poll is only
    # its safety net and runs every max(POLL_INTERVAL, WAKE_POLL_INTERVAL).
    "POLL_INTERVAL": 0.01,
    # Rows the live queries' partition store keeps resident per process (the
    # partitions read least recently are forgotten past it, and read again from the
    # database when needed): the bound on the store's memory, whatever the tables hold.
    "STORE_MAX_ROWS": 200_000,
    # How a SQLite serving process notices commits its engine did not make (a plain
    # ORM save() in this process or another): "inotify" (Linux: every commit appends
    # to the database's -wal file, whoever makes it, and inotify reports the write;
    # while nothing is subscribed the writes are left to the safety poll; elsewhere,
    # or for an in-memory database, it falls back to the poll) or "poll" (an outbox
    # poll every POLL_INTERVAL only).
    "SQLITE_WAKE": "inotify",
    # Seconds between the safety-net outbox polls while a wake-up mechanism runs.
    # Also the bound on how late a serving process learns of a schema change another
    # process committed (its DDL marker) when a wake-up is lost (docs/guide.md).
    "WAKE_POLL_INTERVAL": 1.0,
    # Largest websocket text frame accepted from a client, in bytes.
    "WS_MAX_FRAME_BYTES": 256 * 1024,
    # Client frames per second a connection may send (a token bucket of this rate
    # and WS_BURST); frames beyond it are refused with an error.
    "WS_RATE": 50,
    "WS_BURST": 200,
    # Messages queued for a connection before it is shed (its subscriptions dropped,
    # each told "shed" to re-subscribe later) instead of holding memory or others.
    "WS_MAX_QUEUED_MESSAGES": 256,
    # retryAfterMs a shed subscription is given.
    "WS_SHED_RETRY_MS": 1000,
    # Seconds between re-checks of an open socket's credentials (revoked token,
    # deactivated user, ended session): the bound on how long revocation takes.
    "WS_AUTH_RECHECK_SECONDS": 30,
    # Worker threads of the websocket consumer (rindle_app.realtime.workers), read
    # when the pool is first used: WS_DB_THREADS for the calls that read or write
    # the database (tokens, leases, named queries, mutations), WS_HUB_THREADS for
    # the calls that take the hub's lock (subscribe, unsubscribe, connect,
    # disconnect). Apart, so sockets waiting for the hub never hold up another
    # socket's database call.
    "WS_DB_THREADS": 8,
    "WS_HUB_THREADS": 4,
    # Usage ledger (rindle_app.flow): UTC days of per-namespace flow kept in the
    # store (today included); each flush deletes older rows, and reads never reach
    # past it. FLOW_NODE_ID names this process's rows: None gives every process a
    # fresh id (restarts then add rows, summed at read); a stable id makes a
    # restart continue its rows, and must never be shared by two live processes.
    "FLOW_RETENTION_DAYS": 90,
    "FLOW_NODE_ID": None,
    # Days without a transfer or refusal after which the operator's fleet page
    # calls a namespace quiet (the page's ?silent=N overrides it per view).
    "FLOW_SILENT_AFTER_DAYS": 14,
    # Quotas (rindle_app.flow.quota): bytes moved (wire bytes in + out) per
    # namespace over a rolling window of FLOW_QUOTA_WINDOW_DAYS UTC days, today
    # included (at most FLOW_RETENTION_DAYS). FLOW_QUOTA_BYTES is every namespace's
    # quota (None: unlimited); FLOW_QUOTAS overrides it per namespace
    # ({namespace: bytes, or None for unlimited}). Over quota, an HTTP request is
    # refused with 429 quota_exceeded and a websocket subscribe or pushMutation
    # with quota_exceeded; both change nothing.
    "FLOW_QUOTA_BYTES": None,
    "FLOW_QUOTA_WINDOW_DAYS": 30,
    "FLOW_QUOTAS": {},
    # Seconds between the flushes a serving process makes of its usage ledger into
    # the store (a daemon thread started with the ledger; it flushes once more at
    # exit). A crash loses at most this much counted flow. 0 or None: no timer.
    "FLOW_FLUSH_SECONDS": 60,
    # Public SQL (/v1/sql/*). The stored outcome of a replayable operation (an
    # idempotency key, a transaction commit) is kept this long, so a retry within
    # it replays the answer instead of running again; the sweep deletes it after.
    "SQL_OUTCOME_RETENTION_SECONDS": 24 * 3600,
    # Largest stored outcome, in bytes; a larger answer is kept with its rows
    # elided (the replay still says what committed, with counts and cursor).
    "SQL_OUTCOME_MAX_BYTES": 64 * 1024,
    # Most statements in one batch, or in one interactive transaction.
    "SQL_MAX_STATEMENTS": 256,
    # Largest SQL text of one statement, in bytes.
    "SQL_MAX_STATEMENT_BYTES": 64 * 1024,
    # Most rows one statement may return (more is refused, not truncated).
    "SQL_MAX_RESULT_ROWS": 10_000,
    # Seconds an interactive transaction may stay idle before it expires.
    "SQL_TRANSACTION_IDLE_SECONDS": 60,
    # Open interactive transactions per process, and the bytes of statements and
    # arguments one of them may buffer.
    "SQL_TRANSACTIONS_MAX_OPEN": 256,
    "SQL_TRANSACTION_MAX_BYTES": 1024 * 1024,
    # Client mutations from nobody (POST /api/rindle/mutate, websocket pushMutation)
    # are refused with 403 anonymous_mutations_disabled unless this is True (or the
    # adapter's allow_anonymous_mutations() says so); the demo opts in.
    "ALLOW_ANONYMOUS_MUTATIONS": False,
    # Who may read /metrics (rindle_app.metrics.metrics_view); others get 403
    # metrics_forbidden. None: open while DEBUG is on, else staff sessions only. A
    # dict opens it to any of: "TOKEN" (Authorization: Bearer <TOKEN>), "ADDRESSES"
    # (REMOTE_ADDR in these IPs or CIDR networks), "STAFF" (a staff session; default
    # True), "OPEN" (True: anyone).
    "METRICS_AUTH": None,
    # Subscriptions one socket may hold at once (the lmid query included); one more
    # is refused with queryError too_many_subscriptions.
    "WS_MAX_SUBSCRIPTIONS": 100,
    # Rows the subscriptions of one socket may hold together (each subscription's
    # view footprint: every base row it shows, counts included); a subscribe that
    # would go past it is refused with queryError footprint_too_large. None: no cap.
    "WS_MAX_FOOTPRINT_ROWS": 20_000,
    # Open sockets per principal in this process: a user, a token, or for
    # anonymous sockets the client address (scope["client"]; behind a proxy, run
    # Daphne with --proxy-headers). One more is accepted and closed with 4429.
    # None: no cap.
    "WS_MAX_SOCKETS_PER_PRINCIPAL": 32,
    # Largest server frame, in UTF-8 bytes: Daphne refuses to send a message over
    # its --websocket-max-message-size (1 MiB by default), so this must not exceed
    # it. A snapshot over it is refused with queryError result_too_large; an
    # increment over it drops the subscription with batch_too_large (retryable).
    "WS_MAX_SEND_BYTES": 1024 * 1024,
    # Seconds one public statement may run before it is cancelled (STATEMENT_TIMEOUT,
    # 408, nothing it did is kept, and the writer is free again): PostgreSQL's
    # statement_timeout, SQLite's progress handler (on the writer the statements of
    # one request share the budget). 0: no budget.
    "SQL_STATEMENT_TIMEOUT_SECONDS": 5,
    # Seconds a public statement may wait for a row or table lock (PostgreSQL
    # lock_timeout; LOCK_TIMEOUT, 408, retryable).
    "SQL_LOCK_TIMEOUT_SECONDS": 2,
    # Largest answer of one statement, in bytes of its JSON rows, counted as they are
    # fetched (more is refused with RESULT_TOO_LARGE, not truncated).
    "SQL_MAX_RESULT_BYTES": 8 * 1024 * 1024,
    # Whether /v1/sql/* (not the migrations journal) is served; on PostgreSQL it then
    # needs its sandbox role (system check rindle.E020, SANDBOX_MISSING otherwise).
    "SQL_ENABLED": True,
    # The PostgreSQL role public SQL reads as (write roles are named after it):
    # NOLOGIN, created and granted by `manage.py rindle_sql_role` and by migrate.
    "SQL_SANDBOX_ROLE": "rindle_sql",
    # --- The change stream (rindle_app.stream; DESIGN section 7) ---
    # Seconds between watermark steps: the fleet takes the exclusive side of the
    # outbox fence at most once per interval, whatever the number of app servers.
    # Serving processes see a commit (a migration's DDL marker too) once it is
    # published, so this is most of their delay on PostgreSQL.
    "STREAM_REFRESH_SECONDS": 0.05,
    # Seconds a watermarker's lease lasts unless renewed (on the database clock); a
    # standby takes over at most this long after the leader stops.
    "STREAM_LEASE_TTL_SECONDS": 5.0,
    # Milliseconds a watermark step waits for the exclusive side of the fence (a
    # short write queues behind a waiting step at most this long); past it the step
    # is fence_timed_out (retryable, metered apart) and safe_seq stays.
    "STREAM_FENCE_LOCK_TIMEOUT_MS": 50,
    # Where the watermarker runs on PostgreSQL: "embedded" (every serving process
    # competes for the lease, and the winner runs it) or "external" (only
    # the rindle_watermark management command runs it). Anything else is check
    # rindle.E033, and the runtime refuses to start its hub with it.
    "STREAM_WATERMARKER": "embedded",
    # Seconds of outbox history kept (never below the 7-day floor) and seconds
    # between retention runs, which delete at most STREAM_RETENTION_BATCH rows per
    # transaction.
    "STREAM_RETENTION_SECONDS": 7 * 24 * 3600,
    "STREAM_RETENTION_PERIOD_SECONDS": 3600,
    "STREAM_RETENTION_BATCH": 5000,
    # Seconds the watermark may lag the newest committed seq (an open transaction
    # holding the fence) before /healthz reports degraded.
    "STREAM_HEALTH_LAG_SECONDS": 30,
    # GET /v1/stream: most events in one answer, and the longest long-poll wait.
    "STREAM_PAGE_MAX_EVENTS": 1000,
    "STREAM_LONG_POLL_MAX_SECONDS": 30,
    # GET /v1/stream: seconds between two reads of a waiting long-poll or event
    # stream where no doorbell runs (stream/bell.py: the watermark's notification on
    # PostgreSQL, SQLITE_WAKE on SQLite; where one runs, waiters wake when safe_seq
    # moves and re-read every max(this, WAKE_POLL_INTERVAL) only as a safety net),
    # and the most seqs one answer examines past its cursor (a filtered page over a
    # busy outbox stops there and still advances its cursor).
    "STREAM_LONG_POLL_INTERVAL_SECONDS": 0.1,
    "STREAM_PAGE_SCAN_SEQS": 100_000,
    # GET /v1/stream: the most long-polls and event streams waiting at once in one
    # process (each holds a thread, or a task under ASGI); past it a waiting request
    # is 503 stream_busy with Retry-After. A positive integer (check rindle.E034).
    "STREAM_LONG_POLL_MAX_WAITERS": 4,
}

IMPORT_STRINGS = {"ADAPTER"}


class RindleSettings:
    """
    Attribute access to ``settings.RINDLE`` with defaults.

    Unknown names raise ``AttributeError``; dotted paths in ``IMPORT_STRINGS`` are
    imported; values are re-read after ``setting_changed`` so ``override_settings``
    works in tests.
    """

    def __init__(self):
        self._cache = {}

    @property
    def user_settings(self):
        value = getattr(settings, "RINDLE", None)
        # A malformed RINDLE falls back to the defaults; check rindle.E008 reports it.
        return value if isinstance(value, dict) else {}

    def __getattr__(self, name):
        if name.startswith("_") or name not in DEFAULTS:
            raise AttributeError(f"Invalid rindle setting: {name!r}")
        if name not in self._cache:
            value = self.user_settings.get(name, DEFAULTS[name])
            if name in IMPORT_STRINGS and isinstance(value, str):
                value = import_string(value)
            self._cache[name] = value
        return self._cache[name]

    def reload(self):
        self._cache.clear()


rindle_settings = RindleSettings()


def _reload(*, setting, **kwargs):
    if setting == "RINDLE":
        rindle_settings.reload()


setting_changed.connect(_reload)
