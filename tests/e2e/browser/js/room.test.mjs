// Rooms in rindle.js against fake sockets and a fake lease route: the doorbell's
// presence, the upgrade onto the room socket, room mutations with their own mids,
// mutationOutcome, and the fall back to the main socket.
import assert from "node:assert/strict";
import { beforeEach, test } from "node:test";

import { LMID_QUERY, connect } from "../../../../rindle_app/static/rindle/rindle.js";
import { FakeClock, FakeSocket, LMID_SCHEMA, MemoryStorage, add, batch, edit, hello, progress } from "./harness.mjs";

const HEAD = {
  columns: ["id", "title"],
  primaryKey: [0],
  sort: [[0, true]],
  singular: true,
  relationships: [],
};
const SESSIONS = {
  columns: ["scope", "client_id", "expires_at"],
  primaryKey: [0, 1],
  sort: [
    [0, true],
    [1, true],
  ],
  singular: false,
  relationships: [],
};
const ENDPOINT = "ws://test/ws/rindle/room/?doc=issue%2Fi1";
const ISSUE_TABLE = { name: "issue", columns: ["id", "title", "status"], primaryKey: [0] };
const LEDGER_TABLE = { name: "_rindle_client_mutations", columns: ["client_id", "last_mutation_id"], primaryKey: [0] };

let clock;
let storage;
let leases;
let answers;

beforeEach(() => {
  FakeSocket.reset();
  clock = new FakeClock();
  storage = { local: new MemoryStorage(), session: new MemoryStorage() };
  leases = [];
  answers = [];
});

const tick = () => new Promise((resolve) => setImmediate(resolve));

function fakeFetch(url, init) {
  leases.push({ url, body: JSON.parse(init.body), headers: init.headers });
  const body = answers.shift();
  const status = typeof body === "number" ? body : 200;
  return Promise.resolve({ ok: status === 200, status, json: () => Promise.resolve(body) });
}

function lease({ room = true } = {}) {
  const out = {
    leaseToken: "L",
    expiresAt: Date.now() + 300_000,
    lifecycle: { doorbell: { table: "_rindle_scope_sessions", leaseToken: "D", scope: "issue/i1" } },
  };
  if (room) {
    out.realtime = {
      sourceKey: "room:issue/i1",
      wsEndpoint: ENDPOINT,
      roomToken: "R",
      exp: Date.now() + 300_000,
      doc: "issue/i1",
      tables: [],
    };
  }
  return out;
}

/** A connection with issueLive shown from the main socket, and its lease answered. */
async function leased(answer) {
  answers.push(answer);
  const conn = connect({
    url: "ws://test/ws/rindle/",
    clientID: "c1",
    WebSocket: FakeSocket,
    timers: clock,
    storage,
    realtime: { queries: ["issueLive"], mutators: ["editTitle"], fetch: fakeFetch },
  });
  const seen = [];
  const live = conn.subscribe("issueLive", "i1", (rows) => seen.push(rows[0] && rows[0].title));
  const main = FakeSocket.last;
  main.open();
  const lq = main.queryId(LMID_QUERY);
  main.receive(hello(lq, 1, LMID_SCHEMA), batch(lq, 1, 0, LMID_SCHEMA, [], 1), progress(1));
  const q = main.queryId("issueLive");
  main.receive(hello(q, 1, HEAD), batch(q, 1, 0, HEAD, [add(["i1", "Main title"])], 2), progress(2));
  await tick();
  await tick();
  return { conn, live, main, seen, mainQuery: q };
}

function nhello(queryId, tables) {
  return { t: "nhello", queryId, hello: { epoch: 1, comparatorVersion: 2, tables, normalizedFp: "f" } };
}

function nbatch(queryId, seq, ops, cv) {
  return { t: "nbatch", queryId, batch: { epoch: 1, seq, normalizedFp: "f", ops, cv } };
}

/** Open the room socket and serve issueLive from it: lmid 0, then the issue's row. */
function joinRoom(title = "Room title") {
  const room = FakeSocket.last;
  assert.equal(room.url, ENDPOINT);
  room.open();
  const sent = room.take();
  assert.deepEqual(sent.slice(0, 2), [
    { t: "init", clientID: "c1" },
    { t: "subscribe", queryId: 0, name: LMID_QUERY },
  ]);
  assert.equal(sent[2].leaseToken, "R");
  const qid = sent[2].queryId;
  room.receive(nhello(0, [LEDGER_TABLE]), nbatch(0, 0, [], 0), progress(0));
  room.receive(
    nhello(qid, [ISSUE_TABLE]),
    nbatch(qid, 0, [{ table: "issue", op: "add", row: ["i1", title, "todo"] }], 1),
    progress(1),
  );
  return { room, qid };
}

test("a shown realtime query is leased with the client id, and its doorbell subscribed", async () => {
  const { conn, main } = await leased(lease({ room: false }));
  assert.deepEqual(leases[0].body, { name: "issueLive", args: "i1", clientId: "c1" });
  assert.equal(leases[0].url, "/api/rindle/query");
  const bell = main.history.find((f) => f.t === "subscribe" && f.leaseToken === "D");
  assert.ok(bell, "the doorbell is subscribed by its lease token");
  assert.equal(conn._rooms.size, 0);
  assert.equal(FakeSocket.all.length, 1, "no room socket without realtime");
});

test("the doorbell shows the doc's sessions, and a newcomer re-leases at once", async () => {
  const { conn, main } = await leased(lease({ room: false }));
  const events = [];
  conn.on("realtime", (e) => events.push(e));
  const bell = main.history.find((f) => f.leaseToken === "D").queryId;
  const later = Date.now() + 60_000;
  main.receive(
    hello(bell, 1, SESSIONS),
    batch(bell, 1, 0, SESSIONS, [add(["issue/i1", "c1", later])], 3),
    progress(3),
  );
  assert.deepEqual(events.at(-1).sessions, ["c1"]);
  assert.equal(clock.timers.filter((t) => t.ms === 50).length, 0, "alone: no re-lease");
  main.receive(batch(bell, 1, 1, SESSIONS, [add(["issue/i1", "c2", later])], 4), progress(4));
  assert.deepEqual(events.at(-1).sessions, ["c1", "c2"]);
  answers.push(lease());
  clock.advance(50);
  await tick();
  await tick();
  assert.equal(leases.length, 2);
  assert.equal(FakeSocket.last.url, ENDPOINT, "the second session's lease opened the room");
});

test("a lease with realtime serves the query from the room and drops the main subscription", async () => {
  const { live, main, seen, mainQuery } = await leased(lease());
  main.take();
  joinRoom();
  assert.equal(live.row.title, "Room title");
  assert.deepEqual(seen, ["Main title", "Room title"]);
  assert.deepEqual(main.take(), [{ t: "unsubscribe", queryId: mainQuery }]);
});

test("room mutators go to the room with their own mids, confirmed by the room lmid", async () => {
  const { conn, main } = await leased(lease());
  const { room } = joinRoom();
  main.take();
  const done = conn.mutate("editTitle", { id: "i1", title: "x" });
  assert.deepEqual(room.take(), [
    { t: "pushMutation", envelope: { clientID: "c1", mid: 1, name: "editTitle", args: { id: "i1", title: "x" } } },
  ]);
  conn.mutate("addTag", { id: "t1" });
  const push = main.take().find((f) => f.t === "pushMutation");
  assert.equal(push.envelope.name, "addTag", "other mutators stay on the main path");
  assert.equal(conn.pending, 2);
  room.receive(nbatch(0, 1, [{ table: LEDGER_TABLE.name, op: "add", row: ["c1", 1] }], 1), progress(1));
  assert.deepEqual(await done, { mid: 1, rejected: false });
  assert.equal(conn.pending, 1);
});

test("a rejected outcome settles the room mutation as refused; deopt sends it on the main path", async () => {
  const { conn, main } = await leased(lease());
  const { room } = joinRoom();
  const refused = [];
  conn.on("rejected", (e) => refused.push(e));
  const spam = conn.mutate("editTitle", { title: "spam" });
  room.receive({ t: "mutationOutcome", mid: 1, kind: "rejected", reason: "no spam" });
  assert.equal(refused[0].reason, "no spam");
  assert.equal(refused[0].name, "editTitle");
  room.receive(nbatch(0, 1, [{ table: LEDGER_TABLE.name, op: "add", row: ["c1", 1] }], 1), progress(1));
  assert.deepEqual(await spam, { mid: 1, rejected: true, reason: "no spam" });

  conn.mutate("editTitle", { title: "big" });
  main.take();
  room.receive({ t: "mutationOutcome", mid: 2, kind: "deopt" });
  const push = main.take().find((f) => f.t === "pushMutation");
  assert.equal(push.envelope.name, "editTitle");
  assert.equal(push.envelope.mid, 1, "numbered in the main domain");
});

test("when the room socket closes the query goes back to the main socket, rows kept meanwhile", async () => {
  const { conn, live, main } = await leased(lease());
  const { room } = joinRoom();
  conn.mutate("editTitle", { title: "unconfirmed" });
  main.take();
  room.drop();
  const sent = main.take();
  const resub = sent.find((f) => f.t === "subscribe" && f.name === "issueLive");
  assert.ok(resub, "subscribed on the main socket again");
  assert.equal(
    sent.find((f) => f.t === "pushMutation"),
    undefined,
    "a room mutation already sent never goes the main path: the room may have made it durable",
  );
  assert.equal(conn.pending, 1, "it is still pending, in the room's domain");
  assert.equal(live.row.title, "Room title", "the room's rows stay until the main snapshot");
  main.receive(
    hello(resub.queryId, 1, HEAD),
    batch(resub.queryId, 1, 0, HEAD, [add(["i1", "Main title"])], 5),
    progress(5),
  );
  assert.equal(live.row.title, "Main title");
  conn.mutate("editTitle", { title: "after" });
  assert.equal(main.take().find((f) => f.t === "pushMutation").envelope.args.title, "after");
  assert.ok(clock.delays().includes(50), "a new lease is asked for (a new host may serve it)");
});

test("the doc's next room takes back what the lost one was sent, under the same mid", async () => {
  const { conn, main } = await leased(lease());
  const { room } = joinRoom();
  const done = conn.mutate("editTitle", { id: "i1", title: "sent" });
  assert.equal(room.take().at(-1).envelope.mid, 1);
  room.drop();
  main.take();
  answers.push(lease());
  clock.advance(50);
  await tick();
  await tick();
  const again = FakeSocket.last;
  assert.notEqual(again, room, "a new room socket");
  again.open();
  const qid = again.take()[2].queryId;
  again.receive(nhello(0, [LEDGER_TABLE]), nbatch(0, 0, [], 0), progress(0));  // lmid 0: not durable
  assert.deepEqual(again.take(), [
    { t: "pushMutation", envelope: { clientID: "c1", mid: 1, name: "editTitle", args: { id: "i1", title: "sent" } } },
  ]);
  again.receive(nhello(qid, [ISSUE_TABLE]), nbatch(qid, 0, [{ table: "issue", op: "add", row: ["i1", "sent", "todo"] }], 1), progress(1));
  again.receive(nbatch(0, 1, [{ table: LEDGER_TABLE.name, op: "add", row: ["c1", 1] }], 2), progress(2));
  assert.deepEqual(await done, { mid: 1, rejected: false });
  assert.equal(conn.pending, 0);
  assert.equal(main.take().find((f) => f.t === "pushMutation"), undefined, "never on the main path");
});

test("a room that made it durable before it died confirms it at once: nothing is sent twice", async () => {
  const { conn } = await leased(lease());
  const { room } = joinRoom();
  const done = conn.mutate("editTitle", { id: "i1", title: "flushed" });
  room.take();
  room.drop();
  answers.push(lease());
  clock.advance(50);
  await tick();
  await tick();
  const again = FakeSocket.last;
  again.open();
  again.take();
  const ledger = [{ table: LEDGER_TABLE.name, op: "add", row: ["c1", 1] }];
  again.receive(nhello(0, [LEDGER_TABLE]), nbatch(0, 0, ledger, 3), progress(3));
  assert.deepEqual(await done, { mid: 1, rejected: false });
  assert.equal(again.take().find((f) => f.t === "pushMutation"), undefined);
});

const FENCE = [
  { table: "_rindle_room_watermark", leaseToken: "W", doc: "issue/i1" },
  { table: "_rindle_room_client_mutations", leaseToken: "M", doc: "issue/i1", clientId: "c1" },
  { table: "_rindle_room_mutation_outcomes", leaseToken: "O", doc: "issue/i1", clientId: "c1" },
];
const MARK = { columns: ["doc", "flush_seq"], primaryKey: [0], sort: [[0, true]], singular: false, relationships: [] };
const RLEDGER = {
  columns: ["doc", "client_id", "last_mutation_id"],
  primaryKey: [0, 1],
  sort: [[0, true], [1, true]],
  singular: false,
  relationships: [],
};
const OUTCOMES = {
  columns: ["doc", "client_id", "mid", "kind", "reason"],
  primaryKey: [0, 1, 2],
  sort: [[0, true], [1, true], [2, true]],
  singular: false,
  relationships: [],
};

test("a downgrade's fence streams decide the sent room mutations: applied, rejected, deopt, undecided", async () => {
  const { conn, main } = await leased(lease());
  const { room } = joinRoom();
  room.receive(nbatch(0, 1, [], 1), progress(1));
  const outcomes = [1, 2, 3, 4].map((n) => conn.mutate("editTitle", { title: `t${n}` }));
  assert.equal(room.take().filter((f) => f.t === "pushMutation").length, 4);
  const errors = [];
  conn.on("error", (e) => errors.push(e));
  main.take();
  answers.push({ ...lease({ room: false }), lifecycle: { ...lease().lifecycle, fence: FENCE }, realtimeFence: { sourceKey: "room:issue/i1", doc: "issue/i1", finalFlushSeq: 7 } });
  clock.advance(60_000);
  await tick();
  await tick();
  const frames = main.take();
  assert.equal(frames.find((f) => f.t === "pushMutation"), undefined, "nothing is sent before the fence");
  const qid = (token) => frames.find((f) => f.t === "subscribe" && f.leaseToken === token).queryId;
  const [w, m, o] = ["W", "M", "O"].map(qid);
  main.receive(hello(m, 1, RLEDGER), batch(m, 1, 0, RLEDGER, [add(["issue/i1", "c1", 3])], 6), progress(6));
  main.receive(hello(o, 1, OUTCOMES), batch(o, 1, 0, OUTCOMES, [add(["issue/i1", "c1", 2, "rejected", "no"]), add(["issue/i1", "c1", 3, "deopt", null])], 6), progress(6));
  main.receive(hello(w, 1, MARK), batch(w, 1, 0, MARK, [add(["issue/i1", "6"])], 6), progress(6));
  assert.equal(conn.pending, 4, "the watermark is below the fence: nothing is decided");
  main.receive(batch(w, 1, 1, MARK, [edit(["issue/i1", "6"], ["issue/i1", "7"])], 7), progress(7));
  assert.deepEqual(await outcomes[0], { mid: 1, rejected: false });
  assert.deepEqual(await outcomes[1], { mid: 2, rejected: true, reason: "no" });
  const rerouted = main.take().filter((f) => f.t === "pushMutation");
  assert.deepEqual(rerouted.map((f) => f.envelope.args.title), ["t3"], "a deopt goes the main path");
  assert.equal(conn.pending, 2, "t3 on the main path, t4 held");
  assert.deepEqual(errors.map((e) => [e.code, e.mids]), [["room_mutation_undecided", [4]]]);
});

test("a renewal without realtime closes the room and serves the query from the main socket", async () => {
  const { conn, main } = await leased(lease());
  const { room } = joinRoom();
  main.take();
  answers.push(lease({ room: false }));
  clock.advance(60_000);
  await tick();
  await tick();
  assert.equal(room.readyState, 3, "the room socket is closed");
  assert.equal(conn._rooms.size, 0);
  assert.ok(main.take().find((f) => f.t === "subscribe" && f.name === "issueLive"));
});

test("a query with relationships stays on the main socket, and its renewals join no room", async () => {
  answers.push(lease());
  const conn = connect({
    url: "ws://test/ws/rindle/",
    clientID: "c1",
    WebSocket: FakeSocket,
    timers: clock,
    storage,
    realtime: { queries: ["issueDetail"], mutators: ["editTitle"], fetch: fakeFetch },
  });
  const withTags = { ...HEAD, relationships: [{ name: "tags", slot: 0, child: { ...HEAD, singular: false }, project: null }] };
  const live = conn.subscribe("issueDetail", "i1", null);
  const main = FakeSocket.last;
  main.open();
  const lq = main.queryId(LMID_QUERY);
  main.receive(hello(lq, 1, LMID_SCHEMA), batch(lq, 1, 0, LMID_SCHEMA, [], 1), progress(1));
  const q = main.queryId("issueDetail");
  main.receive(hello(q, 1, withTags), batch(q, 1, 0, withTags, [add(["i1", "Main title"])], 2), progress(2));
  await tick();
  await tick();
  const room = FakeSocket.last;
  room.open();
  const rq = room.take()[2].queryId;
  room.receive(nhello(rq, [ISSUE_TABLE, { name: "tag", columns: ["id", "name"], primaryKey: [0] }]));
  assert.equal(room.readyState, 3, "the room socket is closed again");
  assert.equal(live.row.title, "Main title");
  const sockets = FakeSocket.all.length;
  answers.push(lease());
  clock.advance(60_000);
  await tick();
  await tick();
  assert.equal(FakeSocket.all.length, sockets, "no room socket on renewal");
  conn.mutate("editTitle", { title: "x" });
  assert.ok(main.take().find((f) => f.t === "pushMutation"), "room mutators go the main path");
});

test("a refused lease leaves the query on the main socket and is not asked again", async () => {
  const { conn, live } = await leased(403);
  assert.equal(leases.length, 1);
  assert.equal(live.row.title, "Main title");
  assert.equal(conn._rooms.size, 0);
  assert.equal(clock.timers.length, 0, "no retry is scheduled");
});

test("a lease that fails on the way is asked for again", async () => {
  await leased(503);
  assert.ok(clock.delays().includes(2000));
  answers.push(lease());
  clock.advance(2000);
  await tick();
  await tick();
  assert.equal(FakeSocket.last.url, ENDPOINT);
});
