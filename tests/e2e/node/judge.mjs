// A judge of the Django server: the published rindle clients (@rindle/remote,
// @rindle/optimistic, @rindle/client 0.9.0) connected to a live /ws/rindle/, driven step
// by step by tests/e2e/judges/test_published_clients.py over a line protocol.
//
//   node judge.mjs --url ws://127.0.0.1:PORT/ws/rindle/ --client ID [--user ID]
//                  [--cookie "sessionid=..."] [--flat]
//
// stdin: one JSON command per line, {"id": n, "cmd": ..., ...}. stdout: one JSON reply per
// command, {"id": n, "ok": true, ...} or {"id": n, "ok": false, "error": ...}, always
// carrying the materialized view of every subscribed query (the `state`). Diagnostics go to
// stderr. Only the clients' public APIs are used; the socket itself is the `ws` package's,
// wrapped to send an Origin (and the session cookie) and to let the judge cut it.
//
// Each subscribed query is materialized twice: on the WRITER, one optimistic client holding
// every query and pushing every mutation, and on a SOLO observer, an optimistic client of
// its own that holds only that query (with --flat, a third time by a flat RemoteBackend).
//
// Commands:
//   subscribe {key, name, args}  materialize a named query (args as on the wire)
//   unsubscribe {key}            destroy that query's views (the writer unsubscribes it)
//   state                        the views, the writer's pending mids and confirmed lmid,
//                                the boot ids seen and the rejections reported
//   mutate {name, args, kill?}   invoke a client mutator on the writer; the reply's state is
//                                the view right after the invoke (the prediction). kill
//                                "before" cuts the writer's socket first (the envelope is
//                                lost), "after" right after handing it the envelope
//   deafen                       the writer's socket loses every frame the server sends
//                                from now on (until it is killed)
//   kill                         terminate the writer's socket; its transport reconnects
//   reopenFlat                   replace the flat client by a fresh one (same queries)
//   frames {role?}               the last frames on a role's sockets (default the writer's)
//   quit

import { createInterface } from "node:readline";
import { parseArgs } from "node:util";

import { createOptimisticStore } from "@rindle/optimistic";
import { RemoteOptimisticSource, WsTransport, createRemoteStore } from "@rindle/remote";
import { initWasm } from "@rindle/wasm";
import { WebSocket as NodeWebSocket } from "ws";

import { NAMED, mutators, schema } from "./demo.mjs";

const { values: opts } = parseArgs({
  options: {
    url: { type: "string" },
    client: { type: "string" },
    user: { type: "string", default: "" },
    cookie: { type: "string", default: "" },
    flat: { type: "boolean", default: false },
  },
});
if (!opts.url || !opts.client) {
  process.stderr.write("usage: judge.mjs --url WS_URL --client CLIENT_ID [--user ID] [--cookie C] [--flat]\n");
  process.exit(2);
}

// --- the socket: ws, with an Origin, a cookie, and a tap --------------------------------

const FRAME_LOG = 400;
const frames = new Map(); // role -> the last FRAME_LOG [direction, text] on its sockets
const pushes = {}; // mid -> times the writer handed its envelope to a socket
const sockets = { optimistic: [] }; // role -> every socket opened, oldest first
const bootIds = [];
const origin = new URL(opts.url);
origin.protocol = origin.protocol === "wss:" ? "https:" : "http:";

function record(role, direction, text) {
  if (!frames.has(role)) frames.set(role, []);
  const log = frames.get(role);
  log.push([direction, text]);
  if (log.length > FRAME_LOG) log.shift();
  if (role === "optimistic" && direction === "out" && text.startsWith('{"t":"pushMutation"')) {
    const mid = JSON.parse(text).envelope.mid;
    pushes[mid] = (pushes[mid] ?? 0) + 1;
  }
}

// Node 20 has no global WebSocket; WsTransport looks it up at each (re)connect.
globalThis.WebSocket = class JudgeWebSocket extends NodeWebSocket {
  constructor(url, protocols) {
    const headers = { Origin: origin.origin };
    if (opts.cookie) headers.Cookie = opts.cookie;
    super(url, protocols, { headers });
    const role = new URL(url).searchParams.get("client");
    this.role = role;
    (sockets[role] ??= []).push(this);
    this.on("message", (data) => {
      const text = String(data);
      record(role, "in", text);
      if (role === "optimistic" && text.startsWith('{"t":"nhello"')) {
        const bootId = JSON.parse(text).bootId;
        if (bootId && bootIds.at(-1) !== bootId) bootIds.push(bootId);
      }
    });
    this.on("open", () => record(role, "open", ""));
    this.on("close", (code) => record(role, "close", String(code)));
  }

  send(data, ...rest) {
    record(this.role, "out", String(data));
    return super.send(data, ...rest);
  }

  // A deaf socket loses what the server sends, as a broken network would: nothing reaches
  // the client, not even the frames ws would still deliver while the socket closes.
  emit(event, ...args) {
    if (event === "message" && this.deaf) {
      record(this.role, "lost", String(args[0]));
      return false;
    }
    return super.emit(event, ...args);
  }
};

function endpoint(role) {
  const url = new URL(opts.url);
  url.searchParams.set("client", role);
  return url.toString();
}

// --- the clients --------------------------------------------------------------------------

await initWasm();

const rejected = [];
const ctx = { user: opts.user };

function optimisticClient(clientID, role) {
  const transport = new WsTransport(endpoint(role));
  const source = new RemoteOptimisticSource(transport, clientID);
  const made = createOptimisticStore(schema, source, mutators(opts.user), {
    clientID,
    user: () => opts.user,
    onRejected: (envelope, reason) => {
      if (role === "optimistic") rejected.push({ mid: envelope.mid, name: envelope.name, reason });
    },
  });
  return { transport, ...made };
}

// The writer: every query on one connection, mutations pushed through it.
const main = optimisticClient(opts.client, "optimistic");
// Read-only observers, one connection per query, so each query's view is built from that
// query's own footprint alone (on the writer's connection the local views are computed
// over the union of every query's rows, which could hide a row one query failed to sync).
const solos = new Map(); // key -> client
// The flat client (RemoteBackend) never re-subscribes after its socket reconnects, so after a
// server restart the judge opens a fresh one (`reopenFlat`).
let flat = opts.flat ? flatClient() : null;
const views = new Map(); // key -> {optimistic, solo, flat}
const subscribed = new Map(); // key -> the named query, as built for the client

function flatClient() {
  const transport = new WsTransport(endpoint("flat"));
  return { transport, store: createRemoteStore(schema, transport) };
}

function plain(value) {
  return value === undefined ? null : JSON.parse(JSON.stringify(value));
}

function viewState(view) {
  return { data: plain(view.data), resultType: view.resultType };
}

function state() {
  const inspect = main.backend.__inspect();
  const out = {};
  for (const [key, v] of views) {
    out[key] = { ...viewState(v.optimistic), solo: viewState(v.solo) };
    if (v.flat) out[key].flat = viewState(v.flat);
  }
  return {
    views: out,
    pending: inspect.pending.map((p) => p.mid),
    confirmedLmid: inspect.confirmedLmid,
    nextMid: inspect.nextMid,
    appliedCv: inspect.appliedCv,
    bufferedFrames: inspect.bufferedFrames,
    bootIds: [...bootIds],
    connects: sockets.optimistic.length,
    rejected: [...rejected],
    pushes: { ...pushes },
  };
}

function current() {
  const ws = sockets.optimistic.at(-1);
  if (!ws) throw new Error("no socket yet");
  return ws;
}

const commands = {
  subscribe({ key, name, args }) {
    const define = NAMED[name];
    if (!define) throw new Error(`no client twin for the named query ${name}`);
    if (views.has(key)) throw new Error(`view ${key} already subscribed`);
    const solo = optimisticClient(`${opts.client}-solo-${key}`, `solo-${key}`);
    solos.set(key, solo);
    subscribed.set(key, () => define(args, ctx));
    views.set(key, {
      optimistic: main.store.materialize(define(args, ctx)),
      solo: solo.store.materialize(define(args, ctx)),
      flat: flat ? flat.store.materialize(define(args, ctx)) : null,
    });
    return {};
  },
  unsubscribe({ key }) {
    const v = views.get(key);
    if (!v) throw new Error(`view ${key} is not subscribed`);
    v.optimistic.destroy();
    v.solo.destroy();
    v.flat?.destroy();
    solos.get(key).transport.close();
    solos.delete(key);
    subscribed.delete(key);
    views.delete(key);
    return {};
  },
  reopenFlat() {
    if (!flat) return {};
    flat.transport.close();
    flat = flatClient();
    for (const [key, build] of subscribed) views.get(key).flat = flat.store.materialize(build());
    return {};
  },
  state() {
    return {};
  },
  mutate({ name, args, kill }) {
    // kill "before": the socket is already closing when the envelope is sent, so the frame
    // is lost; kill "after": the frame is handed to the socket, which is cut at once.
    if (kill === "before") current().terminate();
    const mid = main.mutate[name](args);
    if (kill === "after") current().terminate();
    return { mid };
  },
  deafen() {
    current().deaf = true;
    return {};
  },
  kill() {
    current().terminate();
    return {};
  },
  frames({ role }) {
    return { frames: frames.get(role ?? "optimistic") ?? [] };
  },
  quit() {
    closeAll();
    setTimeout(() => process.exit(0), 10);
    return {};
  },
};

function closeAll() {
  main.transport.close();
  for (const solo of solos.values()) solo.transport.close();
  flat?.transport.close();
}

const input = createInterface({ input: process.stdin, crlfDelay: Infinity });
input.on("line", (line) => {
  if (!line.trim()) return;
  let msg;
  try {
    msg = JSON.parse(line);
  } catch (e) {
    process.stdout.write(JSON.stringify({ id: null, ok: false, error: `bad command: ${e.message}` }) + "\n");
    return;
  }
  let reply;
  try {
    const handler = commands[msg.cmd];
    if (!handler) throw new Error(`unknown command ${msg.cmd}`);
    reply = { id: msg.id, ok: true, ...handler(msg), state: state() };
  } catch (e) {
    reply = { id: msg.id, ok: false, error: String(e?.stack ?? e) };
  }
  process.stdout.write(JSON.stringify(reply) + "\n");
});
input.on("close", () => {
  closeAll();
  process.exit(0);
});
process.stdout.write(JSON.stringify({ id: 0, ok: true, ready: true }) + "\n");
