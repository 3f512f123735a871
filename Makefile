# The two commands of the README: `make demo` and `make test`.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: install demo test bench

$(STAMP): requirements.txt
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --disable-pip-version-check -r requirements.txt
	touch $(STAMP)

install: $(STAMP)

demo: install
	$(BIN)/python manage.py migrate --noinput
	$(BIN)/python manage.py rindle_seed_demo
	$(BIN)/python manage.py runserver $${RINDLE_DEMO_ADDR:-127.0.0.1:8000}

test: install
	bash scripts/test.sh

bench: install
	$(BIN)/python bench/mutations.py
