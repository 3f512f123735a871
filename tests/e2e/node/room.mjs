// A room, judged by the published @rindle/optimistic client (createRindleClient, 0.9.0)
// against a live Django server with RINDLE["ROOMS_ENABLED"]: two clients materialize the
// realtime-labelled `issueDetail`. The second lease finds two sessions and is room-served;
// the first client's doorbell re-lease upgrades it onto the same room. Then each client's
// `editTitle` (a declared room mutator) reaches the other through the room socket, and the
// script reports what each view shows and how long the peer took to see each edit.
//
// usage: node room.mjs --api HTTP_URL --ws WS_URL --issue ID --edits N [--cookie C]
//   [--api-b HTTP_URL --ws-b WS_URL]: client B on another server (a fleet)
// prints one JSON line: {roomsA, roomsB, titleA, titleB, receiptsMs, anomalies, rejected}

import { parseArgs } from "node:util";

import { createRindleClient } from "@rindle/optimistic";
import { WebSocket as NodeWebSocket } from "ws";

import { issueDetail, mutators, schema } from "./demo.mjs";

const { values: opts } = parseArgs({
  options: {
    api: { type: "string" },
    ws: { type: "string" },
    "api-b": { type: "string" },
    "ws-b": { type: "string" },
    issue: { type: "string" },
    edits: { type: "string", default: "10" },
    cookie: { type: "string", default: "" },
    downgrade: { type: "boolean", default: false },
    // bench/room_live.py: the same clients without a room (the slow path), and a burst.
    "no-room": { type: "boolean", default: false },
    burst: { type: "string", default: "0" },
  },
});
const CSRF = "k".repeat(32);

globalThis.WebSocket = class RoomJudgeWebSocket extends NodeWebSocket {
  constructor(url, protocols) {
    // The page's origin is the server's own (each client may have its own server).
    const headers = { Origin: `http://${new URL(url).host}` };
    if (opts.cookie) headers.Cookie = opts.cookie;
    super(url, protocols, { headers });
  }
};

const anomalies = [];
const rejected = [];
setTimeout(() => {
  process.stderr.write(`room.mjs: gave up after 50 s; anomalies: ${JSON.stringify(anomalies)}\n`);
  process.exit(1);
}, 50_000).unref();

function client(clientID, api = opts.api, ws = opts.ws) {
  const fetchWithSession = (url, init) => {
    const headers = { ...init.headers, "X-CSRFToken": CSRF };
    headers.Cookie = [opts.cookie, `csrftoken=${CSRF}`].filter(Boolean).join("; ");
    return fetch(url, { ...init, headers });
  };
  return createRindleClient({
    schema,
    mutators: mutators("ada"),
    api: { url: api, fetch: fetchWithSession },
    daemon: { wsUrl: ws },
    clientID,
    onRejected: (envelope, reason) => rejected.push({ clientID, mid: envelope.mid, reason }),
    realtime: {
      mutators: ["editTitle"],
      // Renew the leases every second (the server's occupancy expires in seconds here).
      renewMarginMs: 10_000_000,
      onAnomaly: (a) => anomalies.push(`${clientID}: ${a.kind} ${a.message}`),
    },
  });
}

async function until(what, predicate, ms = 15_000) {
  const deadline = Date.now() + ms;
  while (!predicate()) {
    if (Date.now() > deadline) throw new Error(`timed out waiting for ${what}`);
    await new Promise((r) => setTimeout(r, 2));
  }
}

const sourceKey = `room:issue/${opts.issue}`;
const inRoom = (c) => sourceKey in c.__realtimeInspect().rooms;
const title = (view) => view.data?.title;

const a = await client("room-a");
const viewA = a.store.materialize(issueDetail(opts.issue));
await a.ensure(issueDetail(opts.issue));
const b = await client("room-b", opts["api-b"] || opts.api, opts["ws-b"] || opts.ws);
const viewB = b.store.materialize(issueDetail(opts.issue));
await b.ensure(issueDetail(opts.issue));
if (!opts["no-room"]) {
  await until("B in the room", () => inRoom(b));
  await until("A upgraded into the room", () => inRoom(a));
}

const receiptsMs = [];
const edits = Number(opts.edits);
for (let i = 1; i <= edits; i++) {
  const [writer, reader, readerView] = i % 2 ? [a, b, viewB] : [b, a, viewA];
  const next = `title ${i}`;
  const start = performance.now();
  writer.mutate.editTitle({ id: opts.issue, title: next, updatedAt: 1000 + i });
  await until(`the peer to see edit ${i}`, () => title(readerView) === next);
  receiptsMs.push(performance.now() - start);
  void reader;
}
// A burst: A sends edits back to back; B's view reaching the last one ends it.
let burst = null;
if (Number(opts.burst) > 0) {
  const n = Number(opts.burst);
  const start = performance.now();
  for (let i = 1; i <= n; i++) {
    a.mutate.editTitle({ id: opts.issue, title: `burst ${i}`, updatedAt: 100_000 + i });
  }
  await until("the burst's last edit at B", () => title(viewB) === `burst ${n}`, 120_000);
  burst = { n, ms: performance.now() - start };
}

// Both settle on the last edit once the room's flush confirmed the writers' mids.
await until("both views to agree", () => title(viewA) === title(viewB));
await new Promise((r) => setTimeout(r, 500));
const roomsA = Object.keys(a.__realtimeInspect().rooms);
const roomsB = Object.keys(b.__realtimeInspect().rooms);

// The downgrade: B leaves; once its session is gone past the grace, A's next renewal
// comes back without a room but with the fence, and A's view falls back to the daemon
// while the room's rows stay visible (the ghost) until the watermark covers the final
// flush. Sampled all along, A's view must never show anything but the last edit.
const seenByA = new Set();
const transitions = [];
let downgraded = null;
if (opts.downgrade) {
  const last = title(viewA);
  b.close();
  const t0 = performance.now();
  let lastSeen = null;
  const sampler = setInterval(() => {
    const now = `${String(title(viewA))}|${inRoom(a)}`;
    seenByA.add(String(title(viewA)));
    if (now !== lastSeen) transitions.push([Math.round(performance.now() - t0), now]);
    lastSeen = now;
  }, 1);
  await until("A's downgrade", () => !inRoom(a), 20_000);
  await new Promise((r) => setTimeout(r, 1_000));
  clearInterval(sampler);
  downgraded = { last, now: title(viewA) };
}

process.stdout.write(
  JSON.stringify({
    roomsA,
    roomsB,
    burst,
    downgraded,
    seenByA: [...seenByA],
    transitions,
    titleA: title(viewA),
    titleB: title(viewB),
    receiptsMs,
    anomalies,
    rejected,
  }) + "\n",
);
a.close();
if (!opts.downgrade) b.close();
process.exit(0);
