// The value order, the schema fingerprint and the flat fold of rindle.js, on hand-made
// changes and on a session recorded from the real server (tests/e2e/browser/record_fixture.py).
import assert from "node:assert/strict";
import { readFileSync } from "node:fs";
import { test } from "node:test";

import {
  FoldError,
  Tree,
  compareRows,
  compareValues,
  connect,
  schemaFingerprint,
} from "../../../../rindle_app/static/rindle/rindle.js";
import { FakeClock, FakeSocket, ISSUES, LMID_SCHEMA, MemoryStorage, add, edit, remove } from "./harness.mjs";

const session = JSON.parse(readFileSync(new URL("./fixtures/session.json", import.meta.url)));

test("values order as COMPARATOR_VERSION 2: null, booleans, numbers, strings by code point", () => {
  const ordered = [
    null,
    false,
    true,
    -Infinity,
    -2,
    -0,
    0,
    2,
    10,
    1e300,
    "",
    "A",
    "Z",
    "a",
    "z",
    "é",
    "\uffff",
    "😀", // U+1F600: after U+FFFF by code point, before it in UTF-16 units
  ];
  for (let i = 0; i < ordered.length; i++) {
    for (let j = 0; j < ordered.length; j++) {
      const want = i < j ? -1 : i > j ? 1 : 0;
      assert.equal(compareValues(ordered[i], ordered[j]), want, `${ordered[i]} vs ${ordered[j]}`);
    }
  }
  assert.equal(compareValues(undefined, null), 0);
  assert.equal(compareValues("10", "9"), -1, "strings are not numbers");
});

test("rows order by the sort's columns, descending ones reversed", () => {
  const sort = [
    [1, false],
    [0, true],
  ];
  assert.equal(compareRows(["a", 2], ["b", 1], sort), -1);
  assert.equal(compareRows(["b", 2], ["a", 2], sort), 1);
  assert.equal(compareRows(["a", 2], ["a", 2], sort), 0);
});

test("the fingerprint of every recorded hello is the server's schemaFp", () => {
  const hellos = session.frames.filter((f) => f.t === "hello");
  assert.ok(hellos.length >= 4);
  for (const f of hellos) assert.equal(schemaFingerprint(f.hello.schema), f.hello.schemaFp);
  assert.notEqual(schemaFingerprint(ISSUES), schemaFingerprint(LMID_SCHEMA));
});

test("a tree keeps children sorted, counts projected and duplicate paths counted", () => {
  const tree = new Tree(ISSUES);
  tree.apply(add(["i1", "one", 1], [{ rel: 0, children: [{ row: ["t2", "ui"], rels: [] }, { row: ["t1", "bug"], rels: [] }] }]));
  tree.apply(add(["i2", "two", 2], [{ rel: 1, children: [{ row: ["i2", 3], rels: [] }] }]));
  assert.deepEqual(tree.rows(), [
    { id: "i2", title: "two", createdAt: 2, tags: [], commentCount: 3 },
    { id: "i1", title: "one", createdAt: 1, tags: [{ id: "t1", name: "bug" }, { id: "t2", name: "ui" }], commentCount: 0 },
  ]);
  const before = tree.rows();

  // A child change re-projects its parent only.
  const i1 = ["i1", "one", 1];
  assert.equal(tree.apply(add(["t3", "api"], [], [{ rel: 0, parentRow: i1 }])), true);
  const after = tree.rows();
  assert.equal(after[0], before[0], "an untouched row keeps its object");
  assert.deepEqual(after[1].tags.map((t) => t.name), ["api", "bug", "ui"]);

  // A second path to a row shows it once; it leaves with its last path.
  assert.equal(tree.apply(add(["i2", "two", 2])), false);
  assert.equal(tree.apply(remove(["i2", "two", 2])), false);
  assert.equal(tree.rows().length, 2);
  assert.equal(tree.apply(remove(["i2", "two", 2])), true);
  assert.deepEqual(tree.rows().map((r) => r.id), ["i1"]);
});

test("an edit in place keeps the position; an edit of the sort key moves the row with its children", () => {
  const tree = new Tree(ISSUES);
  tree.apply(add(["a", "A", 3]));
  tree.apply(add(["b", "B", 2], [{ rel: 0, children: [{ row: ["t", "x"], rels: [] }] }]));
  tree.apply(add(["c", "C", 1]));
  tree.apply(edit(["b", "B", 2], ["b", "B!", 2]));
  assert.deepEqual(tree.rows().map((r) => r.title), ["A", "B!", "C"]);
  tree.apply(edit(["b", "B!", 2], ["b", "B!", 9]));
  assert.deepEqual(tree.rows().map((r) => r.id), ["b", "a", "c"]);
  assert.deepEqual(tree.rows()[0].tags, [{ id: "t", name: "x" }]);
  tree.apply(edit(["b", "B!", 9], ["b", "B!", 0]));
  assert.deepEqual(tree.rows().map((r) => r.id), ["a", "c", "b"]);
  assert.equal(tree.apply(edit(["a", "A", 3], ["a", "A", 3])), false, "a no-op edit changes nothing");
});

test("a count falls back to its identity when its row leaves; singular children are objects", () => {
  const schema = {
    ...ISSUES,
    relationships: [
      ...ISSUES.relationships,
      { name: "owner", slot: 2, child: { ...ISSUES.relationships[0].child, singular: true }, project: null },
      { name: "gate", slot: 3, child: null, project: null },
    ],
  };
  const tree = new Tree(schema);
  const row = ["i", "I", 1];
  tree.apply(add(row, [{ rel: 1, children: [{ row: ["i", 2], rels: [] }] }]));
  assert.equal(tree.rows()[0].owner, null);
  tree.apply(add(["u", "Ada"], [], [{ rel: 2, parentRow: row }]));
  tree.apply(edit(["i", 2], ["i", 5], [{ rel: 1, parentRow: row }]));
  assert.deepEqual(tree.rows()[0], { id: "i", title: "I", createdAt: 1, tags: [], commentCount: 5, owner: { id: "u", name: "Ada" } });
  tree.apply(remove(["i", 5], [{ rel: 1, parentRow: row }]));
  assert.equal(tree.rows()[0].commentCount, 0);
  assert.equal(tree.apply(add(["x"], [], [{ rel: 3, parentRow: row }])), false, "a gating slot shows nothing");
  assert.equal("gate" in tree.rows()[0], false);
});

test("a change the tree cannot place is a FoldError", () => {
  const tree = new Tree(ISSUES);
  assert.throws(() => tree.apply(remove(["nope", "", 0])), FoldError);
  assert.throws(() => tree.apply(add(["t", "x"], [], [{ rel: 0, parentRow: ["nope", "", 0] }])), FoldError);
  assert.throws(() => tree.apply(edit(["nope", "", 0], ["nope", "!", 0])), FoldError);
});

test("folding the recorded session gives the rows a fresh connection read afterwards", () => {
  FakeSocket.reset();
  const conn = connect({
    url: "ws://test/ws/rindle/",
    clientID: "replay",
    WebSocket: FakeSocket,
    timers: new FakeClock(),
    storage: { local: new MemoryStorage(), session: new MemoryStorage() },
  });
  const lives = session.queries.map(([name, args]) => conn.subscribe(name, args, null));
  const socket = FakeSocket.last;
  socket.open();
  const ids = socket.history.filter((f) => f.t === "subscribe").map((f) => f.queryId);
  assert.deepEqual(ids, [1, 2, 3, 4], "the same queryIds as the recorded connection");
  socket.receive(...session.frames);
  lives.forEach((live, i) => assert.deepEqual(live.rows, session.expected[i], session.queries[i][0]));
  for (const key of ["gaps", "duplicates", "lateFrames", "fpMismatches", "foldErrors", "resubscribes"]) {
    assert.equal(conn.stats[key], 0, key);
  }
  assert.equal(conn.lmid, 12);
  conn.close();
});
