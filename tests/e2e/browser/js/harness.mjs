// Test doubles for rindle.js: a socket the test plays the server on, a clock the test
// moves, web storage in memory, and builders for server frames.
import { schemaFingerprint } from "../../../../rindle_app/static/rindle/rindle.js";

export class FakeSocket {
  constructor(url) {
    this.url = url;
    this.readyState = 0;
    this.sent = []; // since the last take()
    this.history = []; // everything
    FakeSocket.all.push(this);
  }

  static reset() {
    FakeSocket.all = [];
  }

  static get last() {
    return FakeSocket.all[FakeSocket.all.length - 1];
  }

  send(text) {
    if (this.readyState !== 1) throw new Error("send on a socket that is not open");
    const frame = JSON.parse(text);
    this.sent.push(frame);
    this.history.push(frame);
  }

  close() {
    this.readyState = 3;
    if (this.onclose) this.onclose({});
  }

  // --- the server's side ---
  open() {
    this.readyState = 1;
    if (this.onopen) this.onopen({});
  }

  receive(...frames) {
    for (const frame of frames) this.onmessage({ data: JSON.stringify(frame) });
  }

  drop() {
    this.readyState = 3;
    if (this.onclose) this.onclose({});
  }

  /** Frames sent since the last call. */
  take() {
    const out = this.sent;
    this.sent = [];
    return out;
  }

  /** The queryId of the latest subscribe to `name` on this socket. */
  queryId(name) {
    for (let i = this.history.length - 1; i >= 0; i--) {
      const f = this.history[i];
      if (f.t === "subscribe" && f.name === name) return f.queryId;
    }
    throw new Error(`no subscribe for ${name}`);
  }
}
FakeSocket.all = [];

export class FakeClock {
  constructor() {
    this.now = 0;
    this.timers = [];
  }

  setTimeout = (fn, ms) => {
    const timer = { fn, at: this.now + ms, ms };
    this.timers.push(timer);
    return timer;
  };

  clearTimeout = (timer) => {
    this.timers = this.timers.filter((t) => t !== timer);
  };

  /** Delays of the timers waiting now. */
  delays() {
    return this.timers.map((t) => t.ms);
  }

  advance(ms) {
    const end = this.now + ms;
    for (;;) {
      const due = this.timers.filter((t) => t.at <= end).sort((a, b) => a.at - b.at)[0];
      if (!due) break;
      this.timers = this.timers.filter((t) => t !== due);
      this.now = due.at;
      due.fn();
    }
    this.now = end;
  }
}

export class MemoryStorage {
  constructor() {
    this.map = new Map();
  }
  getItem(key) {
    return this.map.has(key) ? this.map.get(key) : null;
  }
  setItem(key, value) {
    this.map.set(key, String(value));
  }
  removeItem(key) {
    this.map.delete(key);
  }
}

// --- server frames ---

export const LMID_SCHEMA = {
  columns: ["client_id", "last_mutation_id"],
  primaryKey: [0],
  sort: [[0, true]],
  singular: false,
  relationships: [],
};

export const TAG = {
  columns: ["id", "name"],
  primaryKey: [0],
  sort: [
    [1, true],
    [0, true],
  ],
  singular: false,
  relationships: [],
};

/** issue(id, title, createdAt) newest first, with tags and a comment count. */
export const ISSUES = {
  columns: ["id", "title", "createdAt"],
  primaryKey: [0],
  sort: [
    [2, false],
    [0, true],
  ],
  singular: false,
  relationships: [
    { name: "tags", slot: 0, child: TAG, project: null },
    {
      name: "commentCount",
      slot: 1,
      child: {
        columns: ["issueId", "count"],
        primaryKey: [0],
        sort: [[0, true]],
        singular: true,
        relationships: [],
      },
      project: { col: 1, identity: 0 },
    },
  ],
};

export function hello(queryId, epoch, schema) {
  return {
    t: "hello",
    queryId,
    hello: { epoch, comparatorVersion: 2, schema, schemaFp: schemaFingerprint(schema) },
    bootId: "boot-1",
  };
}

export function batch(queryId, epoch, seq, schema, events, cv) {
  return {
    t: "batch",
    queryId,
    batch: { epoch, seq, schemaFp: schemaFingerprint(schema), events, cv },
  };
}

export const progress = (cvMin) => ({ t: "progress", frame: { cvMin } });

export const add = (row, rels = [], path = []) => ({ path, op: { tag: "add", node: { row, rels } } });
export const remove = (row, path = []) => ({ path, op: { tag: "remove", row } });
export const edit = (old, next, path = []) => ({ path, op: { tag: "edit", old, new: next } });
