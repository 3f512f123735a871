"""/metrics: the ProducerCensus gauge, read from memory (a scrape runs no query)."""

import re

import pytest
from django.test import Client

from ..ingest.conftest import scratch_table


def gauge(text, name):
    match = re.search(rf'^{name}{{database="default"}} ([0-9.e+]+)$', text, re.M)
    return None if match is None else float(match.group(1))


@pytest.fixture
def table(engine):
    yield from scratch_table(engine, "metrics_item")


def test_the_census_is_on_metrics_and_a_scrape_runs_no_query(table, django_assert_num_queries):
    engine = table
    for n in range(3):
        engine.producer_write(f"p{n}", 1, [])
    engine.producer_write("p0", 2, [])  # a later write of a known producer
    engine.producer_write("p1", 1, [])  # a replay
    with django_assert_num_queries(0):
        text = Client().get("/metrics").content.decode()
    assert gauge(text, "rindle_producers") == 3
    assert gauge(text, "rindle_writer_queue_depth") == 0
