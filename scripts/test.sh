#!/usr/bin/env bash
# The whole suite: lint, then every test on the embedded default (SQLite + in-memory
# channel layer), then again on PostgreSQL + Redis. Under CI=true a missing service
# is a failure; elsewhere the second pass is skipped with a loud notice.
set -euo pipefail
cd "$(dirname "$0")/.."
BIN=.venv/bin
PG_URL=${RINDLE_TEST_POSTGRES_URL:-postgres://postgres@127.0.0.1:5432/test}
REDIS=${RINDLE_TEST_REDIS_URL:-redis://127.0.0.1:6379/15}

$BIN/ruff check .
$BIN/ruff format --check .

echo "== pass 1/2: SQLite (WAL) + in-memory channel layer"
env -u DATABASE_URL -u REDIS_URL $BIN/python -m pytest "$@"

status=0
$BIN/python scripts/require_services.py "$PG_URL" "$REDIS" || status=$?
case $status in
  0)
    echo "== pass 2/2: PostgreSQL + Redis"
    DATABASE_URL=$PG_URL REDIS_URL=$REDIS $BIN/python -m pytest "$@"
    ;;
  2)
    echo "!! pass 2/2 SKIPPED: PostgreSQL or Redis is unreachable (CI=true makes this fail)" >&2
    ;;
  *)
    exit 1
    ;;
esac
