# The two commands of the README: `make demo` and `make test`.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
TEST_STAMP := $(VENV)/.installed-test
NODE_STAMP := tests/e2e/node/node_modules/.installed

.PHONY: install install-test demo test bench

# The demo's packages (requirements.txt). A changed file reinstalls.
$(STAMP): requirements.txt
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --disable-pip-version-check -r requirements.txt
	touch $(STAMP)

# The suite's tools besides (requirements-test.txt, which includes requirements.txt):
# reinstalled when either file changes.
$(TEST_STAMP): $(STAMP) requirements-test.txt
	$(BIN)/pip install --quiet --disable-pip-version-check -r requirements-test.txt
	touch $(TEST_STAMP)

# The published npm clients the judge tests run (tests/e2e/node); without npm they are
# skipped (under CI=true they fail).
$(NODE_STAMP): tests/e2e/node/package-lock.json
	@if command -v npm >/dev/null 2>&1; then \
		npm ci --prefix tests/e2e/node --silent --no-audit --no-fund && touch $(NODE_STAMP); \
	else \
		echo "npm not found: tests/e2e/node is not installed (its judge tests will skip)" >&2; \
	fi

# What the demo needs: the Python packages.
install: $(STAMP)

# What the tests need besides: the test tools, the npm clients and Debian's chromium
# (browser tests).
install-test: install $(TEST_STAMP) $(NODE_STAMP)
	@command -v chromium >/dev/null 2>&1 || (apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium >/dev/null)

# Demo mode: DEBUG on (the open sign-in, anonymous mutations reaching the demo's
# mutators, runserver serving static files), and a random key of this checkout's own
# in var/secret_key (git-ignored), written once, read when DJANGO_SECRET_KEY is unset.
demo: export DJANGO_DEBUG = 1
demo: install
	@key="$${RINDLE_VAR_DIR:-var}/secret_key"; test -s "$$key" || { \
		mkdir -p "$$(dirname "$$key")" && (umask 077 && $(BIN)/python -c \
		'import secrets; print(secrets.token_urlsafe(50))' > "$$key"); }
	$(BIN)/python manage.py migrate --noinput
	$(BIN)/python manage.py rindle_seed_demo
	$(BIN)/python manage.py runserver $${RINDLE_DEMO_ADDR:-127.0.0.1:8000}

test: install-test
	bash scripts/test.sh

bench: install
	$(BIN)/python bench/mutations.py
