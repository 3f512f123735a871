"""
pushMutation and the Django-shaped mutation edges: a validation rejection's
``mutationOutcome`` carries its code and field errors as a dict, and a mutator's
``permission_classes`` are asked on the socket too (``request.user``, ``request.auth``
the bearer token, ``request.method`` "POST"), refusing with ``permission_denied``
while the lmid still advances.
"""

import pytest
from channels.db import database_sync_to_async
from django.contrib.auth import get_user_model

from project.demo.models import User
from rindle_app import tokens
from tests.support import edge_mutators  # noqa: F401  (registers the t_edge* mutators)

from .conftest import ORIGIN, Client

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.asyncio]

db = database_sync_to_async


def bearer(raw):
    return [ORIGIN, (b"authorization", f"Bearer {raw}".encode())]


def push(name, args, mid=1, client="c1"):
    envelope = {"clientID": client, "mid": mid, "name": name, "args": args}
    return {"t": "pushMutation", "envelope": envelope}


def lmid(client_id):
    from rindle_app.engine import get_engine

    return get_engine().client_lmid(client_id)


def user_ids():
    return sorted(User.objects.values_list("id", flat=True))


async def socket_of(username, *scopes):
    user = await db(get_user_model().objects.create_user)(username)
    raw, _ = await db(tokens.create)(user, list(scopes))
    client = Client(headers=bearer(raw))
    assert await client.connect()
    await client.send({"t": "init", "clientID": "c1"})
    return client


async def test_a_validation_rejection_frame_carries_the_field_errors(live):
    client = await socket_of("alice", "mutate")
    await client.send(push("t_edgeAddUser", {"id": "u1", "name": "far too long a name"}))
    outcome = await client.recv()
    assert outcome["t"] == "mutationOutcome" and outcome["kind"] == "rejected"
    assert outcome["code"] == "invalid_args"
    assert outcome["details"] == {"name": ["Ensure this field has no more than 10 characters."]}
    assert isinstance(outcome["reason"], str) and outcome["reason"].startswith("invalid arguments")
    await client.close()
    assert await db(lmid)("c1") == 1 and await db(user_ids)() == []


async def test_permission_classes_refuse_on_the_socket_and_the_mid_is_consumed(live):
    bob = await socket_of("bob", "mutate")
    await bob.send(push("t_edgeAliceOnly", {"id": "u1"}))
    outcome = await bob.recv()
    assert outcome["t"] == "mutationOutcome" and outcome["code"] == "permission_denied"
    assert outcome["reason"] == "only alice may do this" and "details" not in outcome
    await bob.close()
    assert await db(lmid)("c1") == 1 and await db(user_ids)() == []


async def test_a_permission_class_reads_the_sockets_token_as_request_auth(live):
    plain = await socket_of("carol", "mutate")
    await plain.send(push("t_edgeAdminToken", {"id": "u1"}))
    assert (await plain.recv())["code"] == "permission_denied"
    await plain.close()
    admin = await socket_of("dave", "admin")
    await admin.send({"t": "init", "clientID": "c2"})
    await admin.send(push("t_edgeAdminToken", {"id": "u2"}, client="c2"))
    await admin.send({"t": "subscribe", "queryId": 0, "name": "_rindle/clientLmid"})
    frames = await admin.recv_until("progress")
    assert all(f["t"] != "mutationOutcome" for f in frames)  # applied: no outcome frame
    await admin.close()
    assert await db(user_ids)() == ["u2"]
