// The published flat clients (@rindle/remote 0.9.0, @rindle/client 0.9.0) as the judge of
// rindle_app/realtime/flat.py. Two modes, both JSON on stdin/stdout:
//
//   node tests/realtime/gen_flat_vectors.mjs fp < cases.json
//     Adds `fp` (the client's `schemaFp`) to each `{..., schema}` of a JSON list. This is how
//     tests/realtime/flat-vectors.json is made; regenerate it through the test that owns it:
//       RINDLE_REGEN_FLAT_VECTORS=1 .venv/bin/pytest tests/realtime/test_flat.py -k fingerprint
//
//   node tests/realtime/gen_flat_vectors.mjs fold < streams.json
//     For each `{tables, ast, hello, batches}`, drives a real `Store` over a `RemoteBackend`
//     whose transport replays the recorded `hello` and `batch` frames, and prints the view's
//     `data` after every batch. The protocol checks (fingerprint, comparator, seq) and the fold
//     are the packages' own; any error or rejection exits non-zero.
//
// The packages are loaded from $RINDLE_NPM_ROOT (default tests/e2e/node, where `make install`
// runs `npm ci` on the pinned tests/e2e/node/package-lock.json).

import { readFileSync } from "node:fs";
import { join } from "node:path";
import { pathToFileURL } from "node:url";

const root = process.env.RINDLE_NPM_ROOT || new URL("../e2e/node", import.meta.url).pathname;
const rindle = await import(pathToFileURL(join(root, "node_modules/@rindle/remote/dist/index.js")).href);

const input = JSON.parse(readFileSync(0, "utf8"));
const mode = process.argv[2];

if (mode === "fp") {
  const out = input.map((entry) => ({ ...entry, fp: rindle.schemaFp(entry.schema) }));
  process.stdout.write(JSON.stringify(out, null, 2) + "\n");
} else if (mode === "fold") {
  process.stdout.write(JSON.stringify(input.map(fold)) + "\n");
} else {
  process.stderr.write("usage: gen_flat_vectors.mjs fp|fold < input.json\n");
  process.exit(2);
}

function clientSchema(tables) {
  const types = { string: rindle.string, number: rindle.number, boolean: rindle.boolean, json: rindle.json, int64: rindle.int64 };
  return rindle.createSchema({
    tables: tables.map((t) => {
      const cols = {};
      for (const c of t.columns) {
        const col = types[c.type]();
        cols[c.name] = c.nullable ? col.nullable() : col;
      }
      return rindle.table(t.name).columns(cols).primaryKey(...t.primaryKey);
    }),
  });
}

function fold(stream) {
  const problems = [];
  console.error = (...args) => problems.push(args.join(" "));
  console.warn = (...args) => problems.push(args.join(" "));
  let deliver = null;
  const sent = [];
  const transport = {
    send: (msg) => sent.push(msg),
    onMessage: (handler) => {
      deliver = handler;
    },
    close: () => {},
  };
  const store = new rindle.Store(clientSchema(stream.tables), new rindle.RemoteBackend(transport));
  const view = store.materialize({ ast: () => stream.ast, name: "flat-judge", args: null });
  const subscribe = sent.find((m) => m.t === "subscribe");
  if (!subscribe) throw new Error("the client sent no subscribe");
  const queryId = subscribe.queryId;
  deliver({ t: "hello", queryId, hello: stream.hello });
  const data = [];
  for (const batch of stream.batches) {
    deliver({ t: "batch", queryId, batch });
    // A gap or a rejected frame makes the backend log and re-subscribe instead of throwing.
    if (problems.length) throw new Error(`client rejected the stream: ${problems.join("; ")}`);
    if (sent.filter((m) => m.t === "subscribe").length !== 1) throw new Error("the client re-subscribed");
    data.push(view.data);
  }
  view.destroy();
  return { subscribe, data };
}
