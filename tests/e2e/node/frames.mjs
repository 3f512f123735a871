// A bare websocket for Python tests: each line on stdin is sent as one text frame;
// each frame received is printed as one line; "OPEN" once the socket is open, and a
// {"t":"_closed"} line when it closes.
//
// usage: node frames.mjs WS_URL ORIGIN

import { createInterface } from "node:readline";

import { WebSocket } from "ws";

const [url, origin] = process.argv.slice(2);
const ws = new WebSocket(url, { headers: { origin } });
ws.on("open", () => process.stdout.write("OPEN\n"));
ws.on("message", (data) => process.stdout.write(`${data.toString()}\n`));
ws.on("close", (code) => {
  process.stdout.write(`${JSON.stringify({ t: "_closed", code })}\n`);
  process.exit(0);
});
ws.on("error", (err) => {
  process.stderr.write(`${err}\n`);
  process.exit(1);
});
createInterface({ input: process.stdin }).on("line", (line) => ws.send(line));
