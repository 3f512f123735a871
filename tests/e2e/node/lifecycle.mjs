// The realtime lifecycle's doorbell, judged by the published @rindle/optimistic client
// (createRindleClient, 0.9.0) against a live Django server: two clients materialize the
// realtime-labelled `issueDetail` through the lease route (POST /api/rindle/query). Each
// lease carries the doorbell lease; each client subscribes it as `_rindle/lifecycle` and
// folds the other's occupancy row, and the FIRST client's 0 -> 1 transition re-leases its
// query (the upgrade attempt; no room serves it yet, so it stays daemon-attached).
//
// usage: node lifecycle.mjs --api HTTP_URL --ws WS_URL --issue ID [--cookie C]
// prints one JSON line: {othersA, othersB, leasesA, leasesB, rowsA, rowsB, anomalies}

import { parseArgs } from "node:util";

import { createRindleClient } from "@rindle/optimistic";
import { WebSocket as NodeWebSocket } from "ws";

import { issueDetail, mutators, schema } from "./demo.mjs";

const { values: opts } = parseArgs({
  options: {
    api: { type: "string" },
    ws: { type: "string" },
    issue: { type: "string" },
    cookie: { type: "string", default: "" },
  },
});
const origin = new URL(opts.api).origin;

globalThis.WebSocket = class LifecycleWebSocket extends NodeWebSocket {
  constructor(url, protocols) {
    const headers = { Origin: origin };
    if (opts.cookie) headers.Cookie = opts.cookie;
    super(url, protocols, { headers });
  }
};

const CSRF = "k".repeat(32);
const anomalies = [];
setTimeout(() => {
  process.stderr.write(`lifecycle.mjs: gave up after 40 s; anomalies: ${JSON.stringify(anomalies)}\n`);
  process.exit(1);
}, 40_000).unref();
const leases = {}; // clientID -> leases of issueDetail posted

function client(clientID) {
  leases[clientID] = 0;
  const fetchCounting = async (url, init) => {
    const body = JSON.parse(init.body);
    if (String(url).endsWith("/api/rindle/query") && body.name === "issueDetail") leases[clientID]++;
    // A session POST carries Django's CSRF pair: the cookie and the same value in a header.
    const headers = { ...init.headers, "X-CSRFToken": CSRF };
    headers.Cookie = [opts.cookie, `csrftoken=${CSRF}`].filter(Boolean).join("; ");
    return fetch(url, { ...init, headers });
  };
  return createRindleClient({
    schema,
    mutators: mutators(""),
    api: { url: opts.api, fetch: fetchCounting },
    daemon: { wsUrl: opts.ws },
    clientID,
    realtime: { onAnomaly: (a) => anomalies.push(`${clientID}: ${a.kind} ${a.message}`) },
  });
}

async function until(what, predicate, ms = 10_000) {
  const deadline = Date.now() + ms;
  while (!predicate()) {
    if (Date.now() > deadline) throw new Error(`timed out waiting for ${what}`);
    await new Promise((r) => setTimeout(r, 20));
  }
}

const doc = `issue/${opts.issue}`;
const rowsOf = (view) => JSON.parse(JSON.stringify(view.data ?? null));

const a = await client("lifecycle-a");
const viewA = a.store.materialize(issueDetail(opts.issue));
await a.ensure(issueDetail(opts.issue));
await until("A's doorbell to fold its own session", () => a.backend.otherScopeSessions(doc) === 0);
await new Promise((r) => setTimeout(r, 300)); // A is alone: no re-lease may happen
const aloneLeases = leases["lifecycle-a"];

const b = await client("lifecycle-b");
const viewB = b.store.materialize(issueDetail(opts.issue));
await b.ensure(issueDetail(opts.issue));
await until("A to see B's session", () => a.backend.otherScopeSessions(doc) >= 1);
await until("B to see A's session", () => b.backend.otherScopeSessions(doc) >= 1);
await until("A's doorbell re-lease", () => leases["lifecycle-a"] > aloneLeases);

process.stdout.write(
  JSON.stringify({
    aloneLeases,
    othersA: a.backend.otherScopeSessions(doc),
    othersB: b.backend.otherScopeSessions(doc),
    leasesA: leases["lifecycle-a"],
    leasesB: leases["lifecycle-b"],
    rowsA: rowsOf(viewA),
    rowsB: rowsOf(viewB),
    anomalies,
  }) + "\n",
);
a.close();
b.close();
process.exit(0);
