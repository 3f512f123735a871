// The protocol side of rindle.js against a fake socket: release by cvMin, epoch and seq
// rules, mutations confirmed by the lmid row, reconnect and re-send.
import assert from "node:assert/strict";
import { beforeEach, test } from "node:test";

import { LMID_QUERY, connect, tabClientID } from "../../../../rindle_app/static/rindle/rindle.js";
import {
  FakeClock,
  FakeSocket,
  ISSUES,
  LMID_SCHEMA,
  MemoryStorage,
  add,
  batch,
  edit,
  hello,
  progress,
  remove,
} from "./harness.mjs";

let clock;
let storage;

beforeEach(() => {
  FakeSocket.reset();
  clock = new FakeClock();
  storage = { local: new MemoryStorage(), session: new MemoryStorage() };
});

function open(options = {}) {
  const conn = connect({
    url: "ws://test/ws/rindle/",
    clientID: "c1",
    WebSocket: FakeSocket,
    timers: clock,
    storage,
    ...options,
  });
  return conn;
}

const issue = (id, createdAt, title = id) => [id, title, createdAt];

/** hello + seq 0 + the progress that releases it, for the latest subscribe of `name`. */
function hydrate(socket, name, schema, rows, cv, epoch = 1) {
  const qid = socket.queryId(name);
  socket.receive(hello(qid, epoch, schema), batch(qid, epoch, 0, schema, rows.map((r) => add(r)), cv), progress(cv));
  return qid;
}

function lmidRow(lmid, clientID = "c1") {
  return [clientID, lmid];
}

test("on open: init, then the lmid query, then the app's queries", () => {
  const conn = open();
  conn.subscribe("issuesPage", { limit: 2 }, null);
  conn.subscribe("users", undefined, null);
  const socket = FakeSocket.last;
  assert.equal(socket.url, "ws://test/ws/rindle/");
  socket.open();
  assert.deepEqual(socket.take(), [
    { t: "init", clientID: "c1" },
    { t: "subscribe", queryId: 1, name: LMID_QUERY, args: {} },
    { t: "subscribe", queryId: 2, name: "issuesPage", args: { limit: 2 } },
    { t: "subscribe", queryId: 3, name: "users", args: null },
  ]);
  assert.equal(conn.status, "open");
});

test("data waits for its progress, and two queries change in one step", () => {
  const conn = open();
  const seen = [];
  const a = conn.subscribe("a", null, (rows) => seen.push(["a", rows.length, b.rows.length]));
  const b = conn.subscribe("b", null, (rows) => seen.push(["b", a.rows.length, rows.length]));
  const socket = FakeSocket.last;
  socket.open();
  const qa = hydrate(socket, "a", ISSUES, [issue("x", 1)], 5);
  const qb = hydrate(socket, "b", ISSUES, [], 5);
  assert.equal(a.ready && b.ready, true);
  seen.length = 0;

  socket.receive(
    batch(qa, 1, 1, ISSUES, [add(issue("y", 2))], 7),
    batch(qb, 1, 1, ISSUES, [add(issue("y", 2))], 7),
    batch(qa, 1, 2, ISSUES, [add(issue("z", 3))], 9),
  );
  assert.deepEqual([a.rows.length, b.rows.length], [1, 0], "nothing before the progress");
  socket.receive(progress(8));
  assert.deepEqual(seen, [
    ["a", 2, 1],
    ["b", 2, 1],
  ]);
  assert.deepEqual(a.rows.map((r) => r.id), ["y", "x"], "cv 9 is still held");
  socket.receive(progress(9));
  assert.deepEqual(a.rows.map((r) => r.id), ["z", "y", "x"]);
});

test("a seq-0 snapshot waits for its progress even when cvMin did not move", () => {
  const conn = open();
  const live = conn.subscribe("a", null, null);
  const socket = FakeSocket.last;
  socket.open();
  socket.receive(progress(20));
  const qid = socket.queryId("a");
  socket.receive(hello(qid, 1, ISSUES), batch(qid, 1, 0, ISSUES, [add(issue("x", 1))], 20));
  assert.equal(live.ready, false);
  socket.receive(progress(20));
  assert.deepEqual(live.rows.map((r) => r.id), ["x"]);
});

test("a duplicate seq is ignored and a lower epoch dropped", () => {
  const conn = open();
  const live = conn.subscribe("a", null, null);
  const socket = FakeSocket.last;
  socket.open();
  const qid = hydrate(socket, "a", ISSUES, [], 1, 2);
  socket.receive(batch(qid, 2, 1, ISSUES, [add(issue("x", 1))], 2), progress(2));
  socket.receive(batch(qid, 2, 1, ISSUES, [add(issue("x", 1))], 3), progress(3));
  socket.receive(batch(qid, 1, 5, ISSUES, [add(issue("old", 0))], 4), progress(4));
  assert.deepEqual(live.rows.map((r) => r.id), ["x"]);
  assert.equal(conn.stats.duplicates, 1);
  assert.equal(conn.stats.staleFrames, 1);
  assert.equal(conn.stats.resubscribes, 0);
});

test("a gap re-subscribes the same queryId; the rows stay until the new snapshot", () => {
  const conn = open();
  const live = conn.subscribe("a", { limit: 2 }, null);
  const socket = FakeSocket.last;
  socket.open();
  const qid = hydrate(socket, "a", ISSUES, [issue("x", 1)], 1);
  socket.take();
  socket.receive(batch(qid, 1, 2, ISSUES, [add(issue("y", 2))], 2));
  assert.deepEqual(socket.take(), [{ t: "subscribe", queryId: qid, name: "a", args: { limit: 2 } }]);
  assert.equal(conn.stats.gaps, 1);
  // Frames of the old epoch still in flight are dropped; the rows are kept meanwhile.
  socket.receive(batch(qid, 1, 3, ISSUES, [add(issue("y", 2))], 3), progress(3));
  assert.deepEqual(live.rows.map((r) => r.id), ["x"]);
  socket.receive(hello(qid, 2, ISSUES), batch(qid, 2, 0, ISSUES, [add(issue("y", 2)), add(issue("x", 1))], 3));
  assert.deepEqual(live.rows.map((r) => r.id), ["x"], "still the old rows before the release");
  socket.receive(progress(3));
  assert.deepEqual(live.rows.map((r) => r.id), ["y", "x"]);
});

test("a change the rows cannot take re-subscribes instead of corrupting them", () => {
  const conn = open();
  conn.subscribe("a", null, null);
  const socket = FakeSocket.last;
  socket.open();
  const qid = hydrate(socket, "a", ISSUES, [], 1);
  socket.take();
  socket.receive(batch(qid, 1, 1, ISSUES, [remove(issue("ghost", 1))], 2), progress(2));
  assert.equal(conn.stats.foldErrors, 1);
  assert.deepEqual(socket.take(), [{ t: "subscribe", queryId: qid, name: "a", args: null }]);
});

test("setArgs shows the old rows until the new query's snapshot, then drops the old one", () => {
  const conn = open();
  const live = conn.subscribe("page", { limit: 1 }, null);
  const socket = FakeSocket.last;
  socket.open();
  const first = hydrate(socket, "page", ISSUES, [issue("x", 2)], 1);
  socket.take();
  live.setArgs({ limit: 2 });
  const [sub] = socket.take();
  assert.equal(sub.t, "subscribe");
  assert.deepEqual(sub.args, { limit: 2 });
  assert.notEqual(sub.queryId, first);
  hydrate(socket, "page", ISSUES, [issue("x", 2), issue("w", 1)], 2);
  assert.deepEqual(live.rows.map((r) => r.id), ["x", "w"]);
  assert.deepEqual(socket.take(), [{ t: "unsubscribe", queryId: first }]);
  live.close();
  assert.deepEqual(socket.take(), [{ t: "unsubscribe", queryId: sub.queryId }]);
});

test("a mutation waits for the lmid, takes the next mid, and resolves when the lmid row covers it", async () => {
  const conn = open();
  const counts = [];
  conn.on("pending", (n) => counts.push(n));
  const socket = FakeSocket.last;
  socket.open();
  const one = conn.mutate("editTitle", { id: "x", title: "t" });
  assert.equal(conn.pending, 1);
  socket.take();
  const lmidQuery = hydrate(socket, LMID_QUERY, LMID_SCHEMA, [], 10);
  assert.equal(conn.lmid, 0);
  const two = conn.mutate("setStatus", { id: "x", status: "done" });
  assert.deepEqual(
    socket.take().map((f) => [f.t, f.envelope.mid, f.envelope.name, f.envelope.clientID]),
    [
      ["pushMutation", 1, "editTitle", "c1"],
      ["pushMutation", 2, "setStatus", "c1"],
    ],
  );
  assert.equal(storage.session.getItem("rindle:mid:c1"), "2");

  let settled = null;
  one.then((r) => (settled = r));
  socket.receive(batch(lmidQuery, 1, 1, LMID_SCHEMA, [add(lmidRow(1))], 11));
  await Promise.resolve();
  assert.equal(settled, null, "not before the progress");
  socket.receive(progress(11));
  assert.deepEqual(await one, { mid: 1, rejected: false });
  assert.equal(conn.pending, 1);
  socket.receive(batch(lmidQuery, 1, 2, LMID_SCHEMA, [edit(lmidRow(1), lmidRow(2))], 12), progress(12));
  assert.deepEqual(await two, { mid: 2, rejected: false });
  assert.deepEqual(counts, [1, 2, 1, 0]);
});

test("a rejected mutation still resolves, and the rejected event says why", async () => {
  const conn = open();
  const heard = [];
  conn.on("rejected", (r) => heard.push(r));
  const socket = FakeSocket.last;
  socket.open();
  const lmidQuery = hydrate(socket, LMID_QUERY, LMID_SCHEMA, [lmidRow(4)], 3);
  const done = conn.mutate("editTitle", { id: "x", title: "spam" });
  socket.receive({ t: "mutationOutcome", mid: 5, kind: "rejected", reason: "no spam" });
  assert.deepEqual(heard, [{ mid: 5, name: "editTitle", args: { id: "x", title: "spam" }, reason: "no spam" }]);
  socket.receive(batch(lmidQuery, 1, 1, LMID_SCHEMA, [edit(lmidRow(4), lmidRow(5))], 4), progress(4));
  assert.deepEqual(await done, { mid: 5, rejected: true, reason: "no spam" });
});

test("base: the socket and the lease route sit under the prefix rindle is mounted at", async () => {
  const fetch = async () => ({ ok: false, status: 503, json: async () => ({}) });
  globalThis.location = { protocol: "https:", host: "shop.example" };
  try {
    const conn = connect({ base: "/sync", clientID: "c1", WebSocket: FakeSocket, timers: clock, storage, realtime: { queries: ["a"], fetch } });
    assert.equal(FakeSocket.last.url, "wss://shop.example/sync/ws/rindle/");
    assert.equal(conn._realtime.leaseUrl, "/sync/api/rindle/query");
    const plain = connect({ clientID: "c2", WebSocket: FakeSocket, timers: clock, storage });
    assert.equal(plain.url, "wss://shop.example/ws/rindle/");
  } finally {
    delete globalThis.location;
  }
});

test("a rejection's code and field errors reach the rejected event and the mutate result", async () => {
  const conn = open();
  const heard = [];
  conn.on("rejected", (r) => heard.push(r));
  const socket = FakeSocket.last;
  socket.open();
  const lmidQuery = hydrate(socket, LMID_QUERY, LMID_SCHEMA, [lmidRow(4)], 3);
  const done = conn.mutate("editTitle", { id: "x", title: "" });
  const details = { title: ["This field may not be blank."] };
  const reason = "invalid arguments: title: This field may not be blank.";
  socket.receive({ t: "mutationOutcome", mid: 5, kind: "rejected", reason, code: "invalid_args", details });
  assert.deepEqual(heard[0], { mid: 5, name: "editTitle", args: { id: "x", title: "" }, reason, code: "invalid_args", details });
  socket.receive(batch(lmidQuery, 1, 1, LMID_SCHEMA, [edit(lmidRow(4), lmidRow(5))], 4), progress(4));
  assert.deepEqual(await done, { mid: 5, rejected: true, reason, code: "invalid_args", details });
});

test("a reconnect sends init, the unconfirmed envelopes with their mids in order, then every query", async () => {
  const conn = open();
  const statuses = [];
  conn.on("status", (s) => statuses.push(s));
  const live = conn.subscribe("a", null, null);
  let socket = FakeSocket.last;
  socket.open();
  hydrate(socket, LMID_QUERY, LMID_SCHEMA, [], 1);
  hydrate(socket, "a", ISSUES, [issue("x", 1)], 1);
  const one = conn.mutate("m", { n: 1 });
  const two = conn.mutate("m", { n: 2 });
  socket.drop();
  assert.equal(conn.status, "connecting");
  const three = conn.mutate("m", { n: 3 }); // while down: numbered now, sent on reconnect
  assert.deepEqual(clock.delays(), [250]);

  // Attempts fail: the wait doubles up to 5 s.
  const waits = [];
  for (let i = 0; i < 6; i++) {
    waits.push(clock.delays()[0]);
    clock.advance(clock.delays()[0]);
    FakeSocket.last.drop();
  }
  assert.deepEqual(waits, [250, 500, 1000, 2000, 4000, 5000]);
  assert.deepEqual(clock.delays(), [5000]);
  clock.advance(5000);
  socket = FakeSocket.last;
  socket.open();
  const sent = socket.take();
  assert.deepEqual(
    sent.map((f) => (f.t === "pushMutation" ? `push ${f.envelope.mid}` : f.t === "subscribe" ? `sub ${f.name}` : f.t)),
    ["init", "push 1", "push 2", "push 3", `sub ${LMID_QUERY}`, "sub a"],
  );
  assert.deepEqual(live.rows.map((r) => r.id), ["x"], "rows stay while re-subscribing");
  assert.equal(conn.stats.reconnects, 7);

  // The new socket's epochs start again at 1; its snapshot replaces the rows.
  hydrate(socket, LMID_QUERY, LMID_SCHEMA, [lmidRow(3)], 50);
  hydrate(socket, "a", ISSUES, [issue("y", 2)], 50);
  assert.deepEqual(live.rows.map((r) => r.id), ["y"]);
  assert.deepEqual(
    (await Promise.all([one, two, three])).map((r) => r.mid),
    [1, 2, 3],
  );
  assert.equal(conn.pending, 0);
  assert.deepEqual(statuses, ["open", "connecting", "open"]);
  conn.close();
  assert.equal(conn.status, "closed");
  assert.deepEqual(clock.delays(), []);
});

test("retryable mutation errors re-send the same mids after a backoff", () => {
  const conn = open();
  const socket = FakeSocket.last;
  socket.open();
  hydrate(socket, LMID_QUERY, LMID_SCHEMA, [lmidRow(7)], 1);
  conn.mutate("m", {});
  conn.mutate("m", {});
  socket.take();
  socket.receive(
    { t: "error", message: "database is locked", code: "unavailable", mid: 8, retryable: true },
    { t: "error", message: "gap", code: "mid_gap", mid: 9, lmid: 7 },
  );
  assert.deepEqual(clock.delays(), [200]);
  clock.advance(200);
  assert.deepEqual(socket.take().map((f) => f.envelope.mid), [8, 9]);
  assert.equal(conn.stats.mutationErrors, 2);
});

test("a mid counter carried over from an earlier page is renumbered after a mid_gap", () => {
  storage.session.setItem("rindle:mid:c1", "12");
  const conn = open();
  const socket = FakeSocket.last;
  socket.open();
  hydrate(socket, LMID_QUERY, LMID_SCHEMA, [lmidRow(3)], 1);
  conn.mutate("m", { a: 1 });
  conn.mutate("m", { a: 2 });
  assert.deepEqual(socket.take().filter((f) => f.t === "pushMutation").map((f) => f.envelope.mid), [13, 14]);
  socket.receive({ t: "error", message: "gap", code: "mid_gap", mid: 13, lmid: 3 });
  socket.receive({ t: "error", message: "gap", code: "mid_gap", mid: 14, lmid: 3 });
  clock.advance(200);
  assert.deepEqual(socket.take().map((f) => [f.envelope.mid, f.envelope.args.a]), [
    [4, 1],
    [5, 2],
  ]);
  assert.equal(storage.session.getItem("rindle:mid:c1"), "5");
});

test("an envelope refused for good settles as rejected and the ones behind it move down", async () => {
  const conn = open();
  const errors = [];
  conn.on("error", (e) => errors.push(e.code));
  const socket = FakeSocket.last;
  socket.open();
  hydrate(socket, LMID_QUERY, LMID_SCHEMA, [], 1);
  const bad = conn.mutate("m", { a: 1 });
  conn.mutate("m", { a: 2 });
  socket.take();
  socket.receive({ t: "error", message: "args too large", code: "args_too_large", mid: 1, retryable: false });
  assert.deepEqual(await bad, { mid: 1, rejected: true, reason: "args too large" });
  assert.deepEqual(errors, ["args_too_large"]);
  assert.equal(conn.pending, 1);
  clock.advance(200);
  assert.deepEqual(socket.take().map((f) => f.envelope.mid), [1]);
});

test("arguments that cannot travel are refused at once", () => {
  const conn = open();
  assert.throws(() => conn.mutate("m", { big: "x".repeat(70000) }), RangeError);
  assert.throws(() => conn.mutate("m", { n: 1n }), TypeError);
  assert.throws(() => conn.mutate("", {}), TypeError);
  assert.equal(conn.pending, 0);
});

test("a retryable queryError keeps the rows and re-subscribes later; a refusal sets live.error", () => {
  const conn = open();
  const a = conn.subscribe("a", null, null);
  const errors = [];
  const b = conn.subscribe("b", { bad: true }, (rows, live) => errors.push(live.error));
  const socket = FakeSocket.last;
  socket.open();
  const qa = hydrate(socket, "a", ISSUES, [issue("x", 1)], 1);
  socket.take();
  socket.receive({ t: "queryError", queryId: qa, message: "fell behind", code: "shed", retryable: true, retryAfterMs: 1000 });
  assert.deepEqual(a.rows.map((r) => r.id), ["x"]);
  assert.equal(clock.timers.length, 1);
  const delay = clock.delays()[0];
  assert.ok(delay >= 1000 && delay <= 1250, `${delay}`);
  clock.advance(delay);
  assert.deepEqual(socket.take(), [{ t: "subscribe", queryId: qa, name: "a", args: null }]);

  socket.receive({ t: "queryError", queryId: socket.queryId("b"), message: "bad arguments", code: "invalid_args", retryable: false });
  assert.deepEqual(b.error, { message: "bad arguments", code: "invalid_args" });
  assert.deepEqual(errors, [{ message: "bad arguments", code: "invalid_args" }]);
});

test("query() resolves with the first snapshot and unsubscribes", async () => {
  const conn = open();
  const socket = FakeSocket.last;
  socket.open();
  const rows = conn.query("users", null);
  const qid = hydrate(socket, "users", ISSUES, [issue("x", 1)], 1);
  assert.deepEqual((await rows).map((r) => r.id), ["x"]);
  assert.deepEqual(socket.take().at(-1), { t: "unsubscribe", queryId: qid });
});

test("a client id per tab: one base per browser, a suffix per tab, an instance per extra connection", () => {
  const local = new MemoryStorage();
  const tab1 = { local, session: new MemoryStorage() };
  const tab2 = { local, session: new MemoryStorage() };
  const a = tabClientID(tab1);
  const b = tabClientID(tab2);
  const c = tabClientID(tab1);
  const [baseA, tabA] = a.split("-");
  assert.equal(b.split("-")[0], baseA);
  assert.notEqual(b.split("-")[1], tabA);
  assert.ok(c.startsWith(`${a}.`), c);
  assert.ok(a.length <= 128);
});

test("after a rate_limited error, what still waits for an answer is sent again", () => {
  const conn = open();
  const errors = [];
  conn.on("error", (e) => errors.push(e.code));
  conn.subscribe("a", null, null);
  const socket = FakeSocket.last;
  socket.open();
  hydrate(socket, LMID_QUERY, LMID_SCHEMA, [], 1);
  conn.mutate("m", {});
  socket.take();
  socket.receive({ t: "error", message: "too many frames; slow down", code: "rate_limited" });
  assert.deepEqual(errors, ["rate_limited"]);
  clock.advance(1000);
  assert.deepEqual(
    socket.take().map((f) => (f.t === "subscribe" ? `sub ${f.name}` : `push ${f.envelope.mid}`)),
    ["sub a", "push 1"],
  );
});

test("a tab's client id another principal owns is renewed on a fresh socket", async () => {
  const conn = open({ clientID: undefined });
  const old = conn.clientID;
  const first = FakeSocket.last;
  first.open();
  const waiting = conn.mutate("m", { n: 1 });
  first.take();
  first.receive({ t: "error", message: "client id belongs to another principal", code: "client_id_taken" });
  const second = FakeSocket.last;
  assert.notEqual(second, first);
  assert.notEqual(conn.clientID, old);
  assert.equal(conn.clientID.split("-")[0], old.split("-")[0], "the browser's base is kept");
  const [tab, instance] = conn.clientID.split("-")[1].split(".");
  assert.equal(tab, storage.session.getItem("rindle:tab"), "a reload keeps it");
  assert.equal(instance, old.split(".")[1], "the page's instance number is kept");
  assert.equal(conn.stats.clientIdRenewals, 1);
  first.receive({ t: "queryError", queryId: 1, message: "needs an init frame first", code: "invalid_args", retryable: false });
  second.open();
  assert.deepEqual(second.take().slice(0, 2), [
    { t: "init", clientID: conn.clientID },
    { t: "subscribe", queryId: 1, name: LMID_QUERY, args: {} },
  ]);
  const lmidQuery = hydrate(second, LMID_QUERY, LMID_SCHEMA, [], 2);
  assert.deepEqual(
    second.take().map((f) => [f.t, f.envelope.clientID, f.envelope.mid]),
    [["pushMutation", conn.clientID, 1]],
  );
  second.receive(batch(lmidQuery, 1, 1, LMID_SCHEMA, [add(lmidRow(1, conn.clientID))], 3), progress(3));
  assert.deepEqual(await waiting, { mid: 1, rejected: false });
});

test("a mutation sent under a refused id settles as rejected; an app's own id is the app's", async () => {
  const conn = open({ clientID: undefined });
  const socket = FakeSocket.last;
  socket.open();
  hydrate(socket, LMID_QUERY, LMID_SCHEMA, [], 1);
  const sent = conn.mutate("m", {});
  socket.receive({ t: "error", message: "taken", code: "client_id_taken", mid: 1 });
  assert.deepEqual(await sent, { mid: 1, rejected: true, reason: "taken" });
  assert.equal(conn.pending, 0);

  const fixed = open({ clientID: "mine" });
  const errors = [];
  fixed.on("error", (e) => errors.push(e.code));
  const own = FakeSocket.last;
  own.open();
  own.receive({ t: "error", message: "taken", code: "client_id_taken" });
  assert.equal(FakeSocket.last, own);
  assert.equal(fixed.clientID, "mine");
  assert.deepEqual(errors, ["client_id_taken"]);
});
