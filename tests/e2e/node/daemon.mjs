// The original daemon's control plane, judged by the published @rindle/daemon-client
// (HttpRindleDaemonClient, 0.9.0) and @rindle/api-server's SplitDaemonClient against a live
// Django server: every route the client has, with the original's semantics (replay
// absorption, the mid gap, the corrected retry after an SQL error, reject-mutation,
// idempotency keys, positional change rows, interactive sessions), then a /materialize
// lease subscribed on the websocket (it hydrates and follows a write) and a bogus lease.
//
// usage: node daemon.mjs --base HTTP_URL --ws WS_URL --token RAW [--skip STEP,...]
// prints one JSON line: {checks: {name: value}, failures: [..]}

import { parseArgs } from "node:util";

import { SplitDaemonClient } from "@rindle/api-server";
import { DaemonHttpError, HttpRindleDaemonClient } from "@rindle/daemon-client";
import { WebSocket } from "ws";

const { values: opts } = parseArgs({
  options: {
    base: { type: "string" },
    ws: { type: "string" },
    token: { type: "string" },
    skip: { type: "string", default: "" }, // steps not to run (their checks are absent)
  },
});
const skipped = new Set(opts.skip.split(",").filter(Boolean));
setTimeout(() => {
  process.stderr.write("daemon.mjs: gave up after 50 s\n");
  process.exit(1);
}, 50_000).unref();

const auth = { authorization: `Bearer ${opts.token}` };
// A route under --base, which may carry a path prefix ("http://host/sync").
const route = (path) => new URL(path, opts.base.endsWith("/") ? opts.base : `${opts.base}/`);
const bootIds = [];
const routed = []; // [leg, path] of every request the split client made
function counting(leg) {
  return (url, init) => {
    routed.push([leg, new URL(url).pathname]);
    return fetch(url, init.method === "GET" ? { method: "GET", headers: init.headers } : init);
  };
}
const master = new HttpRindleDaemonClient({
  baseUrl: opts.base,
  headers: auth,
  onBootId: (id) => bootIds.push(id),
});
const split = new SplitDaemonClient(
  new HttpRindleDaemonClient({ baseUrl: opts.base, headers: auth, fetch: counting("writes") }),
  new HttpRindleDaemonClient({ baseUrl: opts.base, headers: () => auth, fetch: counting("reads") }),
);

const checks = {};
const failures = [];
function check(name, value) {
  checks[name] = value;
}
async function status(promise) {
  try {
    await promise;
    return 200;
  } catch (err) {
    if (err instanceof DaemonHttpError) return err.status;
    throw err;
  }
}
async function step(name, fn) {
  if (skipped.has(name)) return;
  try {
    await fn();
  } catch (err) {
    failures.push(`${name}: ${err?.stack ?? err}`);
  }
}

const INSERT_USER = 'INSERT INTO "user" (id, name) VALUES (?, ?)';
const USERS_AST = { table: "user", orderBy: [["id", "asc"]] };

await step("writes", async () => {
  const ins = (id, name) => ({ sql: INSERT_USER, params: [id, name] });
  check("mid1", await master.executeSqlTxn({ clientID: "dc", mid: 1, statements: [ins("d1", "One")] }));
  check("mid1Replay", await master.executeSqlTxn({ clientID: "dc", mid: 1, statements: [ins("d1", "One")] }));
  check("gapStatus", await status(master.executeSqlTxn({ clientID: "dc", mid: 3, statements: [] })));
  const broken = { sql: 'INSERT INTO "user" (nope) VALUES (?)', params: [1] };
  check("sqlErrorStatus", await status(master.executeSqlTxn({ clientID: "dc", mid: 2, statements: [ins("d2", "Two"), broken] })));
  check("afterSqlError", await master.executeSqlRead({ sql: 'SELECT count(*) AS n FROM "user" WHERE id = ?', params: ["d2"] }));
  check("corrected", await master.executeSqlTxn({ clientID: "dc", mid: 2, statements: [ins("d2", "Two")] }));
  check("reject", await master.rejectMutation({ clientID: "dc", mid: 3, reason: "not allowed" }));
  check("rejectReplay", await master.rejectMutation({ clientID: "dc", mid: 3 }));
  check("rejectGapStatus", await status(master.rejectMutation({ clientID: "dc", mid: 9 })));
  check("key1", await master.executeSqlTxn({ idempotencyKey: "import-7", statements: [ins("k1", "Keyed")] }));
  check("key1Replay", await master.executeSqlTxn({ idempotencyKey: "import-7", statements: [ins("k1", "Keyed")] }));
});

await step("reads", async () => {
  check("read", await master.executeSqlRead({ sql: 'SELECT id, name FROM "user" WHERE id LIKE ? ORDER BY id', params: ["d%"] }));
  check("readWriteStatus", await status(master.executeSqlRead({ sql: 'DELETE FROM "user"' })));
  check("query", await master.query({ ast: { ...USERS_AST, where: { type: "simple", op: "=", left: { type: "column", name: "id" }, right: { type: "literal", value: "d1" } } } }));
  check("badAstStatus", await status(master.query({ ast: { table: "nope" } })));
  const schema = await master.schema();
  check("schemaTables", schema.tables.map((t) => t.name));
  const headers = { ...auth, "content-type": "application/json" };
  check("version", await (await fetch(route("version"), { headers: auth })).json());
  check("stats", await (await fetch(route("stats"), { method: "POST", headers, body: "{}" })).json());
});

await step("rowChanges", async () => {
  const batch = { source: "judge", offset: "1", changes: [{ table: "user", op: "add", row: ["p1", "Positional"] }] };
  check("rowChange", await master.applyRowChangeTxn(batch));
  check("rowChangeReplay", await master.applyRowChangeTxn(batch));
  check("rowEdit", await master.applyRowChangeTxn({ source: "judge", offset: "2", changes: [{ table: "user", op: "edit", old: ["p1", "Positional"], row: ["p1", "Edited"] }] }));
  check("epoch", await master.claimRoomEpoch({ doc: "judge/1" }));
  check("roomLmids", await master.roomLmids({ doc: "judge/1", clients: ["nobody"] }));
});

await step("migrate", async () => {
  const m = { id: "judge_0001", statements: ["CREATE TABLE judge_note (id TEXT PRIMARY KEY, body TEXT)"] };
  check("migrate", await master.migrate(m));
  check("migrateReplay", await master.migrate(m));
  check("migrateBatch", await master.migrateBatch([m, { id: "judge_0002", statements: ["ALTER TABLE judge_note RENAME TO x"] }]));
});

await step("sessions", async () => {
  const begin = await master.beginMutationSession({
    clientID: "dc",
    mid: 4,
    statements: [{ sql: INSERT_USER, params: ["s1", "Session"] }],
    query: { sql: 'SELECT name FROM "user" WHERE id = ?', params: ["s1"] },
  });
  check("sessionRead", begin.read);
  await master.execInMutationSession({ sessionId: begin.sessionId, statements: [{ sql: INSERT_USER, params: ["s2", "Two"] }] });
  check("sessionQuery", await master.queryInMutationSession({ sessionId: begin.sessionId, sql: 'SELECT count(*) AS n FROM "user" WHERE id LIKE ?', params: ["s%"] }));
  check("sessionCommit", await master.commitMutationSession({ sessionId: begin.sessionId }));
  check("sessionAbsorbed", await master.beginMutationSession({ clientID: "dc", mid: 4 }));
  check("sessionGoneStatus", await status(master.commitMutationSession({ sessionId: begin.sessionId })));
  const dropped = await master.beginMutationSession({ clientID: "dc", mid: 5, statements: [{ sql: INSERT_USER, params: ["s3", "Dropped"] }] });
  await master.rollbackMutationSession({ sessionId: dropped.sessionId });
  check("afterRollback", await master.executeSqlRead({ sql: 'SELECT count(*) FROM "user" WHERE id = ?', params: ["s3"], consistency: "strong" }));
});

await step("split", async () => {
  await split.materialize({ ast: USERS_AST });
  await split.query({ ast: USERS_AST });
  await split.executeSqlRead({ sql: "SELECT 1" });
  await split.executeSqlRead({ sql: "SELECT 1", consistency: "strong" });
  await split.executeSqlTxn({ clientID: "split", mid: 1, statements: [] });
  await split.rejectMutation({ clientID: "split", mid: 2 });
  await split.dematerialize({ queryKey: "none" });
  check("routed", routed);
});

await step("pins", async () => {
  const headers = { ...auth, "content-type": "application/json" };
  const stats = async () => (await fetch(route("stats"), { method: "POST", headers, body: "{}" })).json();
  const policy = { kind: "pinned", name: "judge-pin" };
  const pin = await master.materialize({ ast: USERS_AST, policy });
  check("pin", { materializationId: pin.materializationId, reused: pin.reused });
  check("pinAgain", await master.materialize({ ast: USERS_AST, policy }));
  check("statsPinned", await stats());
  check("unpin", await master.dematerialize({ name: "judge-pin" }));
  check("statsUnpinned", await stats());
});

function socket() {
  const ws = new WebSocket(opts.ws, { headers: { Origin: new URL(opts.base).origin } });
  const frames = [];
  const waiters = [];
  ws.on("message", (data) => {
    frames.push(JSON.parse(String(data)));
    for (const w of waiters.splice(0)) w();
  });
  const opened = new Promise((resolve, reject) => {
    ws.once("open", resolve);
    ws.once("error", reject);
  });
  async function until(pred, ms = 10_000) {
    const deadline = Date.now() + ms;
    for (;;) {
      const hit = frames.find(pred);
      if (hit) return hit;
      if (Date.now() > deadline) throw new Error(`no such frame in ${JSON.stringify(frames)}`);
      await new Promise((r) => {
        waiters.push(r);
        setTimeout(r, 100);
      });
    }
  }
  return { ws, frames, opened, until, send: (f) => ws.send(JSON.stringify(f)) };
}

function addedIds(frames, queryId) {
  const ids = [];
  for (const f of frames) {
    if (f.t !== "nbatch") continue;
    for (const op of f.batch?.ops ?? []) {
      if ((op.op === "add" || op.op === "edit") && op.table === "user") ids.push((op.row ?? op.new)[0] ?? (op.row ?? op.new).id);
    }
  }
  return ids;
}

await step("websocket", async () => {
  const lease = await master.materialize({ ast: USERS_AST, mode: "normalized", policy: { kind: "whileSubscribed" } });
  check("lease", { ...lease, leaseToken: typeof lease.leaseToken });
  const s = socket();
  await s.opened;
  s.send({ t: "subscribe", queryId: 1, leaseToken: lease.leaseToken, mode: "normalized" });
  check("hello", (await s.until((f) => f.queryId === 1 && (f.t === "nhello" || f.t === "queryError"))).t);
  await s.until((f) => f.t === "progress");
  check("hydrated", addedIds(s.frames).length);
  check("hydratedFrames", s.frames.filter((f) => f.t === "nbatch").length);
  const before = s.frames.length;
  await master.executeSqlTxn({ clientID: "dc", mid: 5, statements: [{ sql: INSERT_USER, params: ["w1", "Live"] }] });
  await s.until((f) => s.frames.indexOf(f) >= before && f.t === "nbatch" && JSON.stringify(f).includes("w1"));
  check("live", true);
  s.send({ t: "subscribe", queryId: 2, leaseToken: "bogus", mode: "normalized" });
  check("bogus", await s.until((f) => f.queryId === 2 && f.t === "queryError"));
  check("statsLive", await (await fetch(route("stats"), { method: "POST", headers: { ...auth, "content-type": "application/json" }, body: "{}" })).json());
  check("dematerialize", await master.dematerialize({ materializationId: lease.materializationId }));
  s.ws.close();
});

check("bootIds", bootIds);
process.stdout.write(`${JSON.stringify({ checks, failures })}\n`);
process.exit(0);
