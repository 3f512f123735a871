"""
The flush credential ``/room-boot`` hands out (``rindle_app.room_credentials``):
it is not the booting token, it works on the flush routes for its doc and its
placement on, with scope ``rooms`` only, it cannot boot again, and it dies with
the token that issued it. Every refusal changes nothing.
"""

import pytest
from rest_framework.test import APIClient

from project.demo import models as demo
from rindle_app import room_credentials, tokens
from tests.engine.conftest import scratch_table

from .conftest import post, token_client

pytestmark = pytest.mark.django_db(transaction=True)

TABLE = "room_credential_rows"
DOC = "issue/i1"


@pytest.fixture
def booter(alice):
    """A broad token (admin holds every scope), as a deployment's api-server may hold."""
    demo.User.objects.create(id="u1", name="Ursula")
    for id in ("i1", "i2"):
        demo.Issue.objects.create(
            id=id, title="t", status="todo", priority="low", owner_id="u1", created_at=1,
            updated_at=1,
        )  # fmt: skip
    return token_client(alice, "admin")


@pytest.fixture
def table(engine):
    yield from scratch_table(engine, TABLE)


def boot(client, doc=DOC):
    reply = post(client, "/api/rindle/room-boot", {"doc": doc})
    assert reply.status_code == 200, reply.content
    return reply.json()


def holder(body):
    """A client presenting only the boot's flush headers, as a room host does."""
    client = APIClient()
    client.credentials(**{f"HTTP_{k.upper().replace('-', '_')}": v for k, v in body.items()})
    return client


def flush(client, offset, epoch, doc=DOC):
    change = {"table": TABLE, "op": "add", "row": {"id": f"r{offset}", "label": "x"}}
    body = {"source": f"room:{doc}", "offset": str(offset), "changes": [change]}
    return post(client, "/apply-row-change-txn", {**body, "doc": doc, "epoch": epoch})


def rows():
    from django.db import connection

    with connection.cursor() as cursor:
        cursor.execute(f'SELECT id FROM "{TABLE}" ORDER BY id')
        return [r[0] for r in cursor.fetchall()]


def epochs():
    from django.db import connection

    with connection.cursor() as cursor:
        cursor.execute("SELECT doc, epoch FROM _rindle_room_placement ORDER BY doc")
        return dict(cursor.fetchall())


def test_the_boot_hands_out_a_credential_that_flushes_its_doc(booter, table):
    body = boot(booter)
    headers = body["flush"]["headers"]
    assert list(headers) == [room_credentials.HEADER]
    assert headers[room_credentials.HEADER].startswith(room_credentials.PREFIX)
    assert booter.raw_token not in headers[room_credentials.HEADER]
    host = holder(headers)
    # The original's room shell claims again at its own boot, then flushes under it.
    claimed = post(host, body["flush"]["urls"]["claim"], {"doc": DOC})
    assert claimed.json() == {"epoch": body["epoch"] + 1}
    assert flush(host, 1, claimed.json()["epoch"]).json()["applied"] is True
    lmids = post(host, body["flush"]["urls"]["lmids"], {"doc": DOC, "clients": ["c1"]})
    assert lmids.json() == {"lmids": {}}
    assert rows() == ["r1"]


@pytest.mark.parametrize(
    ("route", "payload"),
    [
        ("/claim-room-epoch", {"doc": "issue/i2"}),
        ("/room-lmids", {"doc": "issue/i2", "clients": ["c1"]}),
        ("/apply-row-change-txn", None),  # a flush of another doc
        ("/apply-row-change-txn", "early"),  # a flush under an epoch before the credential's
    ],
)
def test_a_credential_is_refused_outside_its_doc_and_placement(booter, table, route, payload):
    boot(booter)
    body = boot(booter)  # the credential of epoch 2
    host = holder(body["flush"]["headers"])
    before = epochs()
    if payload is None:
        reply = flush(host, 1, 1, doc="issue/i2")
    elif payload == "early":
        reply = flush(host, 1, 1)
    else:
        reply = post(host, route, payload)
    assert reply.status_code == 403, reply.content
    assert reply.json()["error"]["code"] == "unauthorized"
    assert epochs() == before and rows() == []


def test_a_credential_holds_scope_rooms_only_and_cannot_boot(booter, table):
    host = holder(boot(booter)["flush"]["headers"])
    before = epochs()
    batch = {"source": "feed", "offset": "1", "changes": []}
    refused = post(host, "/apply-row-change-txn", batch)
    assert refused.status_code == 403
    assert refused.json()["error"]["code"] == "insufficient_scope"
    assert post(host, "/api/rindle/room-boot", {"doc": DOC}).status_code in (401, 403)
    assert post(host, "/api/rindle/room-boot", {"doc": "issue/i2"}).status_code in (401, 403)
    assert post(host, "/execute-sql-read", {"sql": "SELECT 1"}).status_code in (401, 403)
    assert epochs() == before


def test_a_credential_dies_with_its_token_and_cannot_be_forged(booter, table):
    headers = boot(booter)["flush"]["headers"]
    value = headers[room_credentials.HEADER]
    forged = value[:-3] + ("AAA" if not value.endswith("AAA") else "BBB")
    reply = post(
        holder({room_credentials.HEADER: forged}), "/room-lmids", {"doc": DOC, "clients": []}
    )
    assert reply.status_code == 401
    tokens.revoke(booter.token.prefix)
    reply = post(holder(headers), "/room-lmids", {"doc": DOC, "clients": []})
    assert reply.status_code == 401
    assert reply.json()["error"]["code"]


def test_a_credentials_traffic_counts_under_its_tokens_user(booter, table, alice):
    from rindle_app import flow

    def transfers(namespace):
        day = flow.get_ledger().today(namespace, flow.now_ms())
        return 0 if day is None else day.transfers

    host = holder(boot(booter)["flush"]["headers"])
    mine, nobody = transfers(f"user:{alice.pk}"), transfers("anonymous")
    assert post(host, "/room-lmids", {"doc": DOC, "clients": []}).status_code == 200
    assert transfers(f"user:{alice.pk}") == mine + 1
    assert transfers("anonymous") == nobody
