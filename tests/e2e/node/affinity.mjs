// The handshake of @rindle/remote 0.9.0 in affinity mode: it offers the subprotocols
// `offerSubprotocols` builds ("rindle.v1", plus a held `aff.*` ticket) and, as a strict
// browser does, `ws` fails a socket whose 101 selects none of them. Prints one JSON line:
// the selected subprotocol of each offer, and the first frame a subscribe got.
//
//   node affinity.mjs --url ws://127.0.0.1:PORT/ws/rindle/

import { parseArgs } from "node:util";

import { createAffinityTicketStore, offerSubprotocols } from "@rindle/remote";
import { WebSocket } from "ws";

const { values: opts } = parseArgs({ options: { url: { type: "string" } } });
const origin = new URL(opts.url);
origin.protocol = origin.protocol === "wss:" ? "https:" : "http:";

function open(protocols) {
  return new Promise((resolve) => {
    const ws = new WebSocket(opts.url, protocols, { headers: { Origin: origin.origin } });
    ws.on("open", () => {
      ws.send(JSON.stringify({ t: "subscribe", queryId: 1, name: "users", mode: "normalized" }));
    });
    ws.on("message", (data) => {
      resolve({ protocol: ws.protocol, first: JSON.parse(String(data)).t });
      ws.close();
    });
    ws.on("error", (err) => resolve({ error: String(err.message) }));
  });
}

const store = createAffinityTicketStore();
const fresh = await open(offerSubprotocols(store)); // no ticket yet: ["rindle.v1"]
store.set("aff.opaque-ticket");
const ticketed = await open(offerSubprotocols(store)); // ["rindle.v1", "aff.opaque-ticket"]
const bare = await open(undefined); // affinity off: no subprotocol offered
process.stdout.write(JSON.stringify({ fresh, ticketed, bare }) + "\n");
