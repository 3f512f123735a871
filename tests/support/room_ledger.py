"""
The one check of the room crash tests (tests/engine/test_rooms_crash.py, a room
flush killed mid-way; tests/realtime/test_room_host_crash.py, the room host's own
flusher killed mid-way): what the room ledger says equals what was applied.
"""

from collections import Counter

from django.db import connection


def check_room_ledger(table, *, docs, writes, reject_every, batch=1, cursors=False):
    """
    The mids the room ledger covers, summed over ``docs`` docs ``D0..``, once it
    holds that no mutation was applied twice, none was applied without the ledger
    recording it, a flush landed whole (the lmid is a multiple of ``batch``), the
    slow-path ledger is untouched, and under every lmid "no outcome row" holds
    exactly when the mutation was applied (every ``reject_every``-th mid is rejected
    after writing its row). With ``cursors``, each doc's source cursor equals its lmid.
    """
    with connection.cursor() as cursor:
        cursor.execute(f'SELECT label FROM "{table}"')
        labels = Counter(r[0] for r in cursor.fetchall())
        cursor.execute("SELECT doc, client_id, last_mutation_id FROM _rindle_room_client_mutations")
        lmids = {doc: (client, lmid) for doc, client, lmid in cursor.fetchall()}
        cursor.execute("SELECT doc, client_id, mid FROM _rindle_room_mutation_outcomes")
        outcomes = {(doc, client, mid) for doc, client, mid in cursor.fetchall()}
        cursor.execute('SELECT source, "offset" FROM _rindle_source_offsets')
        offsets = {source: int(offset) for source, offset in cursor.fetchall()}
        cursor.execute("SELECT count(*) FROM _rindle_client_mutations")
        (slow_path,) = cursor.fetchone()
    assert max(labels.values(), default=1) == 1, f"a mutation applied twice: {labels}"
    assert slow_path == 0, "a room flush wrote the slow-path ledger"
    landed = 0
    for k in range(docs):
        doc = f"D{k}"
        client, lmid = lmids.get(doc, (f"c{k}", 0))
        assert lmid % batch == 0, f"{doc}: a flush landed in part ({lmid})"
        if cursors:
            assert offsets.get(f"room:{doc}", 0) == lmid, "the ledger and the cursor disagree"
        for mid in range(1, lmid + 1):
            applied = f"{doc}:{mid}" in labels
            assert applied == ((doc, client, mid) not in outcomes), (doc, mid)
            assert applied == (mid % reject_every != 0), (doc, mid)
        beyond = [m for m in range(lmid + 1, writes + 1) if f"{doc}:{m}" in labels]
        assert not beyond, f"{doc}: applied but not recorded by the ledger: {beyond}"
        landed += lmid
    return landed
