"""
The published ``@rindle/remote`` in affinity mode (``daemon.affinity``) offers the
websocket subprotocol ``rindle.v1`` (and its placement ticket), and a browser fails a
socket whose handshake selects none of the offered ones. Judged in Node with the
``ws`` package, as strict as a browser here, against Daphne
(``tests/e2e/node/affinity.mjs``): the server selects ``rindle.v1`` whenever it is
offered, never the ticket, and nothing when nothing is offered.
"""

import pytest

from tests.support.processes import free_port

from .test_published_clients import Server, node_or_skip, run_node

pytestmark = pytest.mark.django_db(transaction=True)


def test_an_affinity_mode_client_gets_the_subprotocol_it_offered(engine, tmp_path):
    node = node_or_skip()
    server = Server(free_port(), tmp_path / "daphne.log")
    server.start()
    try:
        result = run_node(
            node,
            ["affinity.mjs", "--url", f"ws://127.0.0.1:{server.port}/ws/rindle/"],
            server,
            timeout=60,
        )
    finally:
        server.stop()
    assert result["fresh"] == {"protocol": "rindle.v1", "first": "nhello"}, result
    assert result["ticketed"] == {"protocol": "rindle.v1", "first": "nhello"}, result
    assert result["bare"] == {"protocol": "", "first": "nhello"}, result
