// Server-side rendering as the published @rindle/client (0.9.0) does it, against a live
// Django server: for each named query, a ServerStore preloads it through
// POST /api/rindle/read, its dehydrated state is hydrated into a second Store (the browser's
// first paint, which never opens a socket), and a live optimistic client subscribes the same
// query over /ws/rindle/. What the hydrated view shows must be what the live view shows.
//
// Both legs authenticate with one bearer token and send no Origin (a machine client).
//
// usage: node ssr.mjs --api HTTP_URL --ws WS_URL --token RAW --user ID --queries JSON
//   --queries: [[key, name, args], ...]
// prints one JSON line: {key: {read, seeded, live, resultType}, ...}

import { parseArgs } from "node:util";

import { createOptimisticStore } from "@rindle/optimistic";
import { OneShotBackend, RemoteOptimisticSource, Store, WsTransport, createServerStore } from "@rindle/remote";
import { initWasm } from "@rindle/wasm";
import { WebSocket as NodeWebSocket } from "ws";

import { NAMED, mutators, schema } from "./demo.mjs";

const { values: opts } = parseArgs({
  options: {
    api: { type: "string" },
    ws: { type: "string" },
    token: { type: "string" },
    user: { type: "string", default: "" },
    queries: { type: "string" },
  },
});
const authorization = `Bearer ${opts.token}`;

globalThis.WebSocket = class BearerWebSocket extends NodeWebSocket {
  constructor(url, protocols) {
    super(url, protocols, { headers: { Authorization: authorization } });
  }
};

setTimeout(() => {
  process.stderr.write("ssr.mjs: gave up after 40 s\n");
  process.exit(1);
}, 40_000).unref();

const plain = (value) => (value === undefined ? null : JSON.parse(JSON.stringify(value)));
const ctx = { user: opts.user };
const reads = {}; // key -> the raw /api/rindle/read answer

async function read(key, { name, args }) {
  const response = await fetch(`${opts.api}/api/rindle/read`, {
    method: "POST",
    headers: { Authorization: authorization, "Content-Type": "application/json" },
    body: JSON.stringify({ name, args }),
  });
  if (!response.ok) throw new Error(`read ${name}: ${response.status} ${await response.text()}`);
  const body = await response.json();
  reads[key] = body;
  return body;
}

await initWasm();
const queries = JSON.parse(opts.queries);

// The server render: one ServerStore per query, so each read is recorded by its key.
const dehydrated = {};
for (const [key, name, args] of queries) {
  const server = createServerStore(schema, { query: (input) => read(key, input) });
  await server.preload(NAMED[name](args, ctx));
  Object.assign(dehydrated, server.dehydrate());
}

// The browser's first paint: a Store seeded from the HTML's JSON, with no live backend.
const browser = new Store(schema, new OneShotBackend());
browser.hydrate(JSON.parse(JSON.stringify(dehydrated)));

// The live subscription.
const transport = new WsTransport(opts.ws);
const source = new RemoteOptimisticSource(transport, "ssr-live");
const live = createOptimisticStore(schema, source, mutators(opts.user), {
  clientID: "ssr-live",
  user: () => opts.user,
});

const out = {};
const views = [];
for (const [key, name, args] of queries) {
  const seeded = browser.materialize(NAMED[name](args, ctx));
  out[key] = { read: reads[key], seeded: plain(seeded.data) };
  views.push([key, live.store.materialize(NAMED[name](args, ctx))]);
}
while (views.some(([, view]) => view.resultType !== "complete")) {
  await new Promise((resolve) => setTimeout(resolve, 20));
}
// A settled view: give the progress that released the snapshot a moment to fold everywhere.
await new Promise((resolve) => setTimeout(resolve, 200));
for (const [key, view] of views) {
  out[key].live = plain(view.data);
  out[key].resultType = view.resultType;
}
transport.close();
process.stdout.write(JSON.stringify(out) + "\n");
process.exit(0);
