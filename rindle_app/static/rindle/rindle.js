/**
 * rindle.js: a dependency-free browser client for rindle's websocket protocol (flat mode).
 *
 * Load it as an ES module from a Django template, no build step:
 *
 *   <script type="module">
 *     import { connect } from "{% static 'rindle/rindle.js' %}";
 *     const conn = connect();                       // ws(s)://<this host>/ws/rindle/
 *     const live = conn.subscribe("issuesPage", { limit: 50 }, (rows, live) => render(rows));
 *     await conn.mutate("editTitle", { id, title, updatedAt: Date.now() });
 *     live.setArgs({ limit: 100 });                 // new args; old rows stay until new ones land
 *     live.close();
 *     conn.close();
 *   </script>
 *
 * connect(options) -> Connection. Options (all optional):
 *   base        the path rindle is mounted under ("/", the default; "/sync/" for
 *               path("sync/", include("rindle_app.urls")) with the websocket beside it):
 *               the default url is base + "ws/rindle/", the lease route base + "api/rindle/query"
 *   url         websocket URL, absolute or a path (base + "ws/rindle/" by default)
 *   clientID    this connection's client id; by default one per tab (see tabClientID)
 *   clientIDPrefix   put before the per-tab id (say a display name, for presence); max 32
 *   onStatus, onPending, onRejected, onError   shorthands for conn.on(...)
 *   realtime    {queries: [names], mutators: [names]}: rooms (see "Rooms" below); off by default
 *   WebSocket, storage {local, session}, timers {setTimeout, clearTimeout}: for tests
 *
 * Connection:
 *   subscribe(name, args, onChange) -> Live     a named query, kept current
 *   query(name, args) -> Promise<rows>          one snapshot, then unsubscribed
 *   mutate(name, args) -> Promise<{mid, rejected, reason?, code?, details?}>
 *       Resolves when the server's lmid covering the mutation is released, i.e. when the
 *       mutation's effects (if any) are already folded into every Live. It never rejects
 *       for a server-side refusal: a rejected mutation still advances the lmid, and resolves
 *       with rejected: true (and the "rejected" event fires as soon as the server says so).
 *       It throws at once for arguments that cannot be sent (not JSON, over 64 KiB).
 *   pending       number of mutations not yet confirmed
 *   status        "connecting" | "open" | "closed"
 *   lmid          the last released lmid of this client (null until known)
 *   stats         counters of protocol events (gaps, duplicates, lateFrames, fpMismatches...)
 *   on(event, fn) -> unsubscribe   events: "status" (status), "pending" (count),
 *                 "rejected" ({mid, name, args, reason, code?, details?}: details are
 *                 the server's, e.g. DRF's field errors of invalid_args),
 *                 "error" ({message, code, ...}),
 *                 "realtime" ({name, args, doc, sessions: [clientID], room: bool})
 *   close()
 *
 * Live:
 *   rows     the result as plain objects: {...cells, <alias>: [...] | {...} | null | <count>}
 *   row      rows[0] ?? null (for .one() queries such as issueDetail)
 *   ready    true once the first snapshot is applied; error: {message, code} or null
 *   args, setArgs(args), close()
 *   onChange(rows, live) runs after every applied step that touched the query, and on errors.
 *
 * How it works. Each subscription keeps the server's flat result tree: per level, rows kept
 * ordered by the level's `sort` (COMPARATOR_VERSION 2: null first, false < true, numbers
 * numerically, strings by code point, which is UTF-8 byte order), found by binary search,
 * with a reference count for a row reached by several paths. Frames are checked per
 * subscription: a lower epoch is dropped, a lower seq is a duplicate, a higher seq is a gap
 * and re-subscribes the query (the server answers with a new epoch and a fresh seq 0). Data
 * frames are buffered and applied only when a `progress{cvMin}` releases them, all queries
 * in one step, so two queries never show two different moments. Mutations carry a mid from
 * a per-tab counter (sessionStorage); their confirmation is the `_rindle/clientLmid` row,
 * released like any data. A dropped socket reconnects after min(250 * 2^n, 5000) ms, sends
 * `init`, re-sends unconfirmed mutations with their original mids in order, and
 * re-subscribes every query; rows stay on screen until the new snapshots land. A client id
 * belongs to the principal (user, token or session) that first wrote under it: when the
 * server refuses the tab's id (`client_id_taken`, say after signing in or out), the tab
 * takes a fresh id on a fresh socket (see renewTabClientID).
 *
 * Rooms (opt-in: `realtime.queries`). A Live of a listed query, once its first snapshot is
 * shown, also leases it (`POST /api/rindle/query` with the client id; renewed before it
 * expires). The lease's `lifecycle.doorbell` is subscribed on the main socket: its rows
 * are the doc's sessions ("realtime" event), and a new one re-leases at once, which is how
 * the second person's arrival upgrades the first. A lease carrying `realtime` opens the
 * room socket (`realtime.wsEndpoint`): `init`, the ROOM lmid stream (queryId 0) and the
 * room token; its first snapshot replaces the main-socket subscription, which is dropped.
 * Mutations named in `realtime.mutators` then go to the room with their own mid sequence
 * (the room domain), confirmed by the room lmid (durable once the room flushed them). A
 * `mutationOutcome` of `rejected` settles one like a refusal, `deopt` sends it again on the
 * main path. When the room socket closes, or a renewal comes back without `realtime`, the
 * Live subscribes on the main socket again (the room's rows stay until its snapshot lands).
 * Room mutations never sent go on the main path; one SENT stays in the room's domain (the
 * room may have made it durable before the socket died), so it is never applied twice:
 * the doc's next room takes it again under its mid (a replay if durable), or, when a
 * downgrade's lease carries the fence streams, the room ledger and outcomes decide it once
 * the room's watermark passed `realtimeFence.finalFlushSeq`. Limits: only a query without
 * relationships is served from a room (its rows are the room's normalized rows; joining
 * them would need the query's correlations, which the flat hello does not carry); room
 * mutators go to a room only while exactly one room is open.
 */

export const COMPARATOR_VERSION = 2;

/** The `code` and `details` a rejection's `mutationOutcome` carries, when it has them. */
function rejection(msg) {
  const out = {};
  if (typeof msg.code === "string") out.code = msg.code;
  if (msg.details && typeof msg.details === "object") out.details = msg.details;
  return out;
}
export const LMID_QUERY = "_rindle/clientLmid";

const RECONNECT_MIN_MS = 250;
const RECONNECT_MAX_MS = 5000;
const RESEND_MIN_MS = 200;
const RESEND_MAX_MS = 5000;
const QUERY_RETRY_MS = 500;
const RECOVERY_MS = 1000;
const QUERY_RETRY_MAX_MS = 30000;
const MAX_ARGS_BYTES = 65536;
const MAX_BUFFERED_FRAMES = 10000;
const LEASE_URL = "/api/rindle/query";
const LEASE_RENEW_MAX_MS = 60000;
const LEASE_RETRY_MS = 2000;
const DOORBELL_SETTLE_MS = 50;
// The room fence streams a downgrade's lease carries (lifecycle.fence), by table.
const ROOM_WATERMARK = "_rindle_room_watermark";
const ROOM_LEDGER = "_rindle_room_client_mutations";
const ROOM_OUTCOMES = "_rindle_room_mutation_outcomes";
const OPEN = 1; // WebSocket.OPEN
const EMPTY = Object.freeze([]);

// --- value order (COMPARATOR_VERSION 2) ---------------------------------------------------

function rank(value) {
  if (value === null || value === undefined) return 0;
  switch (typeof value) {
    case "boolean":
      return 1;
    case "number":
      return 2;
    case "string":
      return 3;
    default:
      return 4;
  }
}

/** Order two strings by code point, which is the order of their UTF-8 bytes. */
function compareStrings(a, b) {
  if (a === b) return 0;
  const n = Math.min(a.length, b.length);
  for (let i = 0; i < n; i++) {
    const x = a.charCodeAt(i);
    const y = b.charCodeAt(i);
    if (x === y) continue;
    // UTF-16 units order like code points except that surrogates (astral characters)
    // sort below U+E000..U+FFFF; lift them above.
    const xs = x >= 0xd800 && x <= 0xdfff;
    const ys = y >= 0xd800 && y <= 0xdfff;
    if (xs !== ys) return xs ? 1 : -1;
    return x < y ? -1 : 1;
  }
  return a.length === b.length ? 0 : a.length < b.length ? -1 : 1;
}

/** -1, 0 or 1: the comparator's order of two cells. */
export function compareValues(a, b) {
  const ra = rank(a);
  const rb = rank(b);
  if (ra !== rb) return ra < rb ? -1 : 1;
  switch (ra) {
    case 0:
      return 0;
    case 1:
      return a === b ? 0 : a ? 1 : -1;
    case 2:
      if (a < b) return -1;
      if (a > b) return 1;
      if (a === 0 && b === 0) {
        const na = Object.is(a, -0);
        const nb = Object.is(b, -0);
        return na === nb ? 0 : na ? -1 : 1;
      }
      return 0;
    case 3:
      return compareStrings(a, b);
    default:
      return compareStrings(JSON.stringify(a), JSON.stringify(b));
  }
}

/** Order two positional rows by a level's sort, `[[columnIndex, ascending], ...]`. */
export function compareRows(a, b, sort) {
  for (const [col, asc] of sort) {
    const c = compareValues(a[col], b[col]);
    if (c !== 0) return asc ? c : -c;
  }
  return 0;
}

function sameRow(a, b) {
  if (a.length !== b.length) return false;
  for (let i = 0; i < a.length; i++) if (!Object.is(a[i], b[i]) && a[i] !== b[i]) return false;
  return true;
}

// --- schema fingerprint -------------------------------------------------------------------

const FNV_OFFSET = 0xcbf29ce484222325n;
const FNV_PRIME = 0x100000001b3n;
const MASK64 = 0xffffffffffffffffn;

function utf8(text) {
  if (typeof TextEncoder !== "undefined") return new TextEncoder().encode(text);
  return Array.from(unescape(encodeURIComponent(text)), (ch) => ch.charCodeAt(0));
}

class Fnv64 {
  constructor() {
    this.h = FNV_OFFSET;
  }
  byte(b) {
    this.h = ((this.h ^ BigInt(b & 0xff)) * FNV_PRIME) & MASK64;
  }
  u32(v) {
    for (let shift = 0; shift < 32; shift += 8) this.byte((v >>> shift) & 0xff);
  }
  str(text) {
    const bytes = utf8(text);
    this.u32(bytes.length);
    for (const b of bytes) this.byte(b);
  }
}

function hashLevel(f, level) {
  f.byte(0x53);
  f.u32(level.columns.length);
  for (const c of level.columns) f.str(c);
  f.u32(level.primaryKey.length);
  for (const i of level.primaryKey) f.str(level.columns[i]);
  f.u32(level.sort.length);
  for (const [i, asc] of level.sort) {
    f.str(level.columns[i]);
    f.byte(asc ? 1 : 0);
  }
  f.byte(level.singular ? 1 : 0);
  f.u32(level.relationships.length);
  for (const rel of level.relationships) {
    f.str(rel.name);
    if (!rel.child) {
      f.byte(0);
      continue;
    }
    f.byte(1);
    hashLevel(f, rel.child);
    if (rel.project) {
      f.byte(1);
      f.str(rel.child.columns[rel.project.col]);
    } else {
      f.byte(0);
    }
  }
}

/** The flat hello's `schemaFp`: FNV-1a 64 over the schema's names, as 16 hex digits. */
export function schemaFingerprint(schema) {
  const f = new Fnv64();
  hashLevel(f, schema);
  return f.h.toString(16).padStart(16, "0");
}

// --- the fold ------------------------------------------------------------------------------

/** The stream contradicts the tree (a missing parent, row or edit target). */
export class FoldError extends Error {}

function search(list, row, sort) {
  let lo = 0;
  let hi = list.length;
  while (lo < hi) {
    const mid = (lo + hi) >>> 1;
    const c = compareRows(list[mid].row, row, sort);
    if (c < 0) lo = mid + 1;
    else if (c > 0) hi = mid;
    else return { found: true, index: mid };
  }
  return { found: false, index: lo };
}

function emptyKids(level) {
  return level.relationships.map((rel) => (rel.child ? [] : null));
}

function buildNode(wire, level) {
  const node = { row: wire.row, rc: 1, kids: emptyKids(level), out: null };
  for (const { rel, children } of wire.rels || []) {
    const child = level.relationships[rel] && level.relationships[rel].child;
    if (!child) continue;
    const list = node.kids[rel];
    for (const c of children) {
      const at = search(list, c.row, child.sort);
      if (at.found) list[at.index].rc += 1;
      else list.splice(at.index, 0, buildNode(c, child));
    }
  }
  return node;
}

function copyNode(node) {
  return {
    row: node.row,
    rc: node.rc,
    kids: node.kids.map((list) => (list ? list.map(copyNode) : null)),
    out: null,
  };
}

/**
 * One query's result tree, folded from flat changes `{path:[{rel, parentRow}], op}` where
 * op is `{tag:"add", node:{row, rels:[{rel, children}]}}`, `{tag:"remove", row}` or
 * `{tag:"edit", old, new}`. `rows()` projects it to plain objects, reusing the objects of
 * untouched subtrees.
 */
export class Tree {
  constructor(schema) {
    this.schema = schema;
    this.top = [];
    this.cache = null;
  }

  /** Fold one change; true when the visible result changed. Throws FoldError. */
  apply(change) {
    let list = this.top;
    let level = this.schema;
    const spine = [];
    for (const seg of change.path || []) {
      const rel = level.relationships[seg.rel];
      if (!rel || !rel.child) return false; // a gating relationship: nothing to show
      const at = search(list, seg.parentRow, level.sort);
      if (!at.found) throw new FoldError("parent row not found on the change's path");
      const parent = list[at.index];
      spine.push(parent);
      list = parent.kids[seg.rel];
      level = rel.child;
    }
    const changed = this.applyOp(list, level, change.op);
    if (changed) {
      for (const node of spine) node.out = null;
      this.cache = null;
    }
    return changed;
  }

  applyOp(list, level, op) {
    const sort = level.sort;
    if (op.tag === "add") {
      const at = search(list, op.node.row, sort);
      if (at.found) {
        list[at.index].rc += 1; // another path to a row already shown
        return false;
      }
      list.splice(at.index, 0, buildNode(op.node, level));
      return true;
    }
    if (op.tag === "remove") {
      const at = search(list, op.row, sort);
      if (!at.found) throw new FoldError("remove of a row that is not there");
      const node = list[at.index];
      if (node.rc > 1) {
        node.rc -= 1;
        return false;
      }
      list.splice(at.index, 1);
      return true;
    }
    if (op.tag === "edit") {
      if (sameRow(op.old, op.new)) return false;
      const at = search(list, op.old, sort);
      if (!at.found) throw new FoldError("edit of a row that is not there");
      const node = list[at.index];
      if (compareRows(op.old, op.new, sort) === 0) {
        node.row = op.new;
        node.out = null;
        return true;
      }
      // The sort key changed: the row moves, keeping its children. A row held by other
      // paths stays where it is for them.
      let moving;
      if (node.rc > 1) {
        node.rc -= 1;
        moving = copyNode(node);
        moving.rc = 1;
      } else {
        list.splice(at.index, 1);
        moving = node;
      }
      moving.row = op.new;
      moving.out = null;
      const to = search(list, op.new, sort);
      if (to.found) {
        const target = list[to.index];
        target.rc += moving.rc;
        target.row = op.new;
        target.out = null;
      } else {
        list.splice(to.index, 0, moving);
      }
      return true;
    }
    throw new FoldError(`unknown change ${JSON.stringify(op && op.tag)}`);
  }

  rows() {
    if (this.cache === null) this.cache = this.top.map((n) => project(n, this.schema));
    return this.cache;
  }
}

function project(node, level) {
  if (node.out !== null) return node.out;
  const out = {};
  level.columns.forEach((name, i) => {
    if (node.row[i] !== undefined) out[name] = node.row[i];
  });
  level.relationships.forEach((rel, i) => {
    if (!rel.child) return;
    const kids = node.kids[i];
    if (rel.project) {
      out[rel.name] = kids.length ? kids[0].row[rel.project.col] : rel.project.identity;
    } else if (rel.child.singular) {
      out[rel.name] = kids.length ? project(kids[0], rel.child) : null;
    } else {
      out[rel.name] = kids.map((k) => project(k, rel.child));
    }
  });
  node.out = out;
  return out;
}

// --- identity ------------------------------------------------------------------------------

function randomId(bytes) {
  const buf = new Uint8Array(bytes);
  if (globalThis.crypto && globalThis.crypto.getRandomValues) globalThis.crypto.getRandomValues(buf);
  else for (let i = 0; i < bytes; i++) buf[i] = Math.floor(Math.random() * 256);
  return Array.from(buf, (b) => b.toString(16).padStart(2, "0")).join("");
}

function stored(area, key, mint) {
  try {
    if (!area) return null;
    let value = area.getItem(key);
    if (!value) {
      value = mint();
      area.setItem(key, value);
    }
    return value;
  } catch {
    return null; // storage refused (privacy mode): fall back to a fresh id
  }
}

function browserStorage() {
  const pick = (name) => {
    try {
      return globalThis[name] || null;
    } catch {
      return null;
    }
  };
  return { local: pick("localStorage"), session: pick("sessionStorage") };
}

let instancesThisLoad = 0;

/**
 * A client id for this tab: a per-browser base (localStorage), a per-tab suffix
 * (sessionStorage, so a reload keeps it and another tab gets its own), and a per-load
 * instance number for a second connection in the same page. Two tabs therefore never
 * share a mid sequence. A tab duplicated by the browser copies sessionStorage and shares
 * the suffix until reloaded.
 */
export function tabClientID(storage = browserStorage()) {
  const base = stored(storage.local, "rindle:client", () => randomId(8)) || randomId(8);
  const tab = stored(storage.session, "rindle:tab", () => randomId(4)) || randomId(4);
  const n = instancesThisLoad++;
  return n === 0 ? `${base}-${tab}` : `${base}-${tab}.${n}`;
}

/**
 * A fresh client id for this tab, after the server refused its id (another principal owns
 * it). The tab's stored suffix is replaced, so a reload keeps the new id; an instance
 * number of `old` is kept.
 */
export function renewTabClientID(storage = browserStorage(), old = "") {
  const base = stored(storage.local, "rindle:client", () => randomId(8)) || randomId(8);
  const tab = randomId(4);
  try {
    if (storage.session) storage.session.setItem("rindle:tab", tab);
  } catch {
    // storage refused: the new id serves this page
  }
  const instance = /\.\d+$/.exec(old);
  return `${base}-${tab}${instance ? instance[0] : ""}`;
}

function mountBase(base) {
  if (!base) return "/";
  const path = String(base);
  return `${path.startsWith("/") ? "" : "/"}${path}${path.endsWith("/") ? "" : "/"}`;
}

function defaultUrl(path) {
  const loc = globalThis.location;
  if (/^wss?:\/\//.test(path)) return path;
  if (!loc) throw new Error("rindle: pass an absolute ws:// url outside a browser");
  const scheme = loc.protocol === "https:" ? "wss:" : "ws:";
  return `${scheme}//${loc.host}${path.startsWith("/") ? "" : "/"}${path}`;
}

function utf8Length(text) {
  return utf8(text).length;
}

// --- the connection ------------------------------------------------------------------------

export function connect(options = {}) {
  return new Connection(options);
}

export class Connection {
  constructor(options = {}) {
    // `base`: where rindle is mounted (path("sync/", include("rindle_app.urls")) -> "/sync/").
    const base = mountBase(options.base);
    this.url = defaultUrl(options.url || `${base}ws/rindle/`);
    this._WebSocket = options.WebSocket || globalThis.WebSocket;
    this._timers = options.timers || {
      setTimeout: (fn, ms) => setTimeout(fn, ms),
      clearTimeout: (t) => clearTimeout(t),
    };
    const storage = options.storage || browserStorage();
    this._session = storage.session;
    // An id the app chose is the app's to replace; a tab's own id is renewed when refused.
    this._storage = options.clientID ? null : storage;
    this._idPrefix = String(options.clientIDPrefix || "").slice(0, 32);
    this.clientID = options.clientID || this._idPrefix + tabClientID(storage);
    this._midKey = `rindle:mid:${this.clientID}`;
    this._memoryMid = 0;
    this._listeners = {
      status: new Set(),
      pending: new Set(),
      rejected: new Set(),
      error: new Set(),
      realtime: new Set(),
    };
    const realtime = options.realtime || null;
    this._realtime = realtime && {
      queries: new Set(realtime.queries || []),
      mutators: new Set(realtime.mutators || []),
      leaseUrl: realtime.leaseUrl || `${base}${LEASE_URL.slice(1)}`,
      fetch: realtime.fetch || (globalThis.fetch && globalThis.fetch.bind(globalThis)),
    };
    this._rooms = new Map(); // doc -> room (see _openRoom)
    // doc -> {entries, fence}: room mutations SENT to a room that went away before it
    // confirmed them. A sent mutation is never sent on the main path (the room may have
    // made it durable): the doc's next room takes them again under their mids (replays
    // absorbed), or a downgrade's fence streams resolve them (see _watchFence).
    this._orphans = new Map();
    if (options.onStatus) this.on("status", options.onStatus);
    if (options.onPending) this.on("pending", options.onPending);
    if (options.onRejected) this.on("rejected", options.onRejected);
    if (options.onError) this.on("error", options.onError);

    this.status = "connecting";
    this.lmid = null;
    this.bootId = null;
    this.stats = {
      frames: 0,
      releases: 0,
      duplicates: 0,
      gaps: 0,
      staleFrames: 0,
      lateFrames: 0,
      fpMismatches: 0,
      foldErrors: 0,
      resubscribes: 0,
      reconnects: 0,
      mutationErrors: 0,
      clientIdRenewals: 0,
    };
    this._subs = new Map(); // queryId -> subscription state
    this._nextQueryId = 1;
    this._buffer = [];
    this._released = 0;
    this._arrivals = 0;
    this._pending = []; // {mid, name, args, resolve, rejected}
    this._ws = null;
    this._attempt = 0;
    this._reconnectTimer = null;
    this._resendTimer = null;
    this._resendAttempt = 0;
    this._recoveryTimer = null;
    this._closed = false;
    this._lmidSub = this._addSub(LMID_QUERY, {}, null, true);
    this._open();
  }

  get pending() {
    let n = this._pending.length;
    for (const room of this._rooms.values()) n += room.pending.length;
    for (const held of this._orphans.values()) n += held.entries.length;
    return n;
  }

  on(event, fn) {
    const set = this._listeners[event];
    if (!set) throw new Error(`rindle: unknown event ${event}`);
    set.add(fn);
    return () => set.delete(fn);
  }

  subscribe(name, args, onChange) {
    return new Live(this, name, args === undefined ? null : args, onChange || null);
  }

  query(name, args) {
    if (this._closed) return Promise.reject(new Error("rindle: the connection is closed"));
    return new Promise((resolve, reject) => {
      this.subscribe(name, args, (rows, live) => {
        if (live.error) reject(Object.assign(new Error(live.error.message), live.error));
        else if (live.ready) resolve(rows);
        else return;
        live.close();
      });
    });
  }

  mutate(name, args) {
    if (typeof name !== "string" || !name) throw new TypeError("rindle: a mutator name is required");
    const value = args === undefined ? null : args;
    const text = JSON.stringify(value); // throws for what JSON cannot carry
    if (text !== undefined && utf8Length(text) > MAX_ARGS_BYTES) {
      throw new RangeError(`rindle: mutation arguments exceed ${MAX_ARGS_BYTES} bytes`);
    }
    if (this._closed) throw new Error("rindle: the connection is closed");
    const room = this._mutationRoom(name);
    if (room) return this._mutateInRoom(room, name, value);
    return new Promise((resolve) => {
      this._pending.push({ mid: null, name, args: value, resolve, rejected: null });
      this._emit("pending", this.pending);
      this._flushPending();
    });
  }

  close() {
    if (this._closed) return;
    this._closed = true;
    this._timers.clearTimeout(this._reconnectTimer);
    this._timers.clearTimeout(this._resendTimer);
    this._timers.clearTimeout(this._recoveryTimer);
    for (const sub of this._subs.values()) this._timers.clearTimeout(sub.retryTimer);
    for (const room of [...this._rooms.values()]) this._closeRoom(room);
    const ws = this._ws;
    this._ws = null;
    if (ws) {
      try {
        ws.close();
      } catch {
        // already closing
      }
    }
    this._setStatus("closed");
  }

  // --- socket -----------------------------------------------------------------------------

  _open() {
    const ws = new this._WebSocket(this.url);
    this._ws = ws;
    ws.onopen = () => {
      if (ws !== this._ws) return;
      this._attempt = 0;
      this._onOpen();
    };
    ws.onmessage = (event) => {
      if (ws !== this._ws) return;
      let msg;
      try {
        msg = JSON.parse(typeof event.data === "string" ? event.data : String(event.data));
      } catch {
        this._emit("error", { message: "unreadable frame from the server", code: "bad_frame" });
        return;
      }
      this.stats.frames += 1;
      this._onFrame(msg);
    };
    ws.onclose = () => {
      if (ws !== this._ws) return;
      this._ws = null;
      if (this._closed) return;
      this._setStatus("connecting");
      const delay = Math.min(RECONNECT_MIN_MS * 2 ** this._attempt, RECONNECT_MAX_MS);
      this._attempt += 1;
      this._reconnectTimer = this._timers.setTimeout(() => {
        this._reconnectTimer = null;
        if (!this._closed) {
          this.stats.reconnects += 1;
          this._open();
        }
      }, delay);
    };
    ws.onerror = () => {}; // a close follows; it schedules the reconnect
  }

  _isOpen() {
    return this._ws !== null && this.status === "open" && this._ws.readyState === OPEN;
  }

  _send(msg) {
    if (!this._isOpen()) return false;
    this._ws.send(JSON.stringify(msg));
    return true;
  }

  _onOpen() {
    // A new socket starts a new release timeline and new epochs; rows stay on screen
    // until each query's new snapshot is released.
    this._buffer = [];
    this._released = 0;
    for (const sub of this._subs.values()) {
      this._timers.clearTimeout(sub.retryTimer);
      sub.retryTimer = null;
      sub.epoch = 0;
      sub.awaitingHello = true;
      sub.nextSeq = 0;
    }
    this._setStatus("open");
    this._send({ t: "init", clientID: this.clientID });
    for (const entry of this._pending) if (entry.mid !== null) this._sendEnvelope(entry);
    for (const sub of this._subs.values()) this._sendSubscribe(sub);
    this._flushPending();
  }

  _setStatus(status) {
    if (this.status === status) return;
    this.status = status;
    this._emit("status", status);
  }

  _emit(event, value) {
    for (const fn of this._listeners[event]) {
      try {
        fn(value);
      } catch (err) {
        console.error("rindle: listener failed", err);
      }
    }
  }

  // --- subscriptions ----------------------------------------------------------------------

  _addSub(name, args, live, system = false, lease = null) {
    const sub = {
      id: this._nextQueryId++,
      name,
      args,
      live,
      system,
      epoch: 0,
      fp: null,
      schema: null,
      nextSeq: 0,
      awaitingHello: true,
      tree: null,
      ready: false,
      error: null,
      retryTimer: null,
      retryAttempt: 0,
      lease, // a lease token to subscribe with instead of name and args
      onRows: null, // fn(sub) after each applied step (the doorbell)
    };
    this._subs.set(sub.id, sub);
    this._sendSubscribe(sub);
    return sub;
  }

  _sendSubscribe(sub) {
    sub.awaitingHello = true;
    if (sub.lease !== null) this._send({ t: "subscribe", queryId: sub.id, leaseToken: sub.lease });
    else this._send({ t: "subscribe", queryId: sub.id, name: sub.name, args: sub.args });
  }

  _dropSub(sub) {
    if (!this._subs.has(sub.id)) return;
    this._subs.delete(sub.id);
    this._timers.clearTimeout(sub.retryTimer);
    this._buffer = this._buffer.filter((f) => f.sub !== sub);
    this._send({ t: "unsubscribe", queryId: sub.id });
  }

  _resubscribe(sub, why) {
    if (sub.awaitingHello) return; // already re-subscribing
    this.stats.resubscribes += 1;
    console.warn(`rindle: re-subscribing ${sub.name} (query ${sub.id}): ${why}`);
    this._buffer = this._buffer.filter((f) => f.sub !== sub);
    this._sendSubscribe(sub);
  }

  _failSub(sub, message, code) {
    sub.error = { message, code: code || null };
    this._subs.delete(sub.id);
    this._buffer = this._buffer.filter((f) => f.sub !== sub);
    if (sub.system) this._emit("error", { message: `${LMID_QUERY}: ${message}`, code });
    if (sub.live) sub.live._changed(sub);
  }

  // --- frames -----------------------------------------------------------------------------

  _onFrame(msg) {
    switch (msg && msg.t) {
      case "hello":
        return this._onHello(msg);
      case "batch":
        return this._onBatch(msg);
      case "progress":
        return this._onProgress(msg.frame || {});
      case "queryError":
        return this._onQueryError(msg);
      case "error":
        return this._onError(msg);
      case "mutationOutcome":
        return this._onOutcome(msg);
      default:
        return undefined; // normalized frames and later additions are not for this client
    }
  }

  _onHello(msg) {
    const sub = this._subs.get(msg.queryId);
    const hello = msg.hello;
    if (!sub || !hello) return;
    if (hello.epoch < sub.epoch) {
      this.stats.staleFrames += 1;
      return;
    }
    if (hello.comparatorVersion !== COMPARATOR_VERSION) {
      this._failSub(
        sub,
        `the server orders values by comparator ${hello.comparatorVersion}, ` +
          `this client by ${COMPARATOR_VERSION}`,
        "comparator_mismatch",
      );
      return;
    }
    if (schemaFingerprint(hello.schema) !== hello.schemaFp) {
      this.stats.fpMismatches += 1;
      console.warn(`rindle: ${sub.name}: schemaFp ${hello.schemaFp} does not match its schema`);
    }
    if (msg.bootId !== undefined) this.bootId = msg.bootId;
    sub.epoch = hello.epoch;
    sub.schema = hello.schema;
    sub.fp = hello.schemaFp;
    sub.nextSeq = 0;
    sub.awaitingHello = false;
    sub.retryAttempt = 0;
    this._buffer = this._buffer.filter((f) => f.sub !== sub);
  }

  _onBatch(msg) {
    const sub = this._subs.get(msg.queryId);
    const batch = msg.batch;
    if (!sub || !batch || sub.awaitingHello) return;
    if (batch.epoch < sub.epoch) {
      this.stats.staleFrames += 1;
      return;
    }
    if (batch.epoch > sub.epoch || batch.schemaFp !== sub.fp) {
      this._resubscribe(sub, `batch of epoch ${batch.epoch} / fp ${batch.schemaFp} unexpected`);
      return;
    }
    if (batch.seq < sub.nextSeq) {
      this.stats.duplicates += 1;
      return;
    }
    if (batch.seq > sub.nextSeq) {
      this.stats.gaps += 1;
      this._resubscribe(sub, `expected seq ${sub.nextSeq}, got ${batch.seq}`);
      return;
    }
    sub.nextSeq = batch.seq + 1;
    const frame = {
      sub,
      epoch: batch.epoch,
      seq: batch.seq,
      cv: typeof batch.cv === "number" ? batch.cv : 0,
      schema: sub.schema,
      events: batch.events || [],
      n: this._arrivals++,
    };
    if (frame.seq > 0 && frame.cv <= this._released) {
      // The progress that covers it was already released: apply it now rather than lose it.
      this.stats.lateFrames += 1;
      console.warn(`rindle: ${sub.name}: batch cv ${frame.cv} arrived after its release`);
      this._release([frame]);
      return;
    }
    this._buffer.push(frame);
    if (this._buffer.length > MAX_BUFFERED_FRAMES) {
      console.warn("rindle: too many unreleased frames; re-subscribing everything");
      this._buffer = [];
      for (const s of this._subs.values()) this._resubscribe(s, "buffer overflow");
    }
  }

  _onProgress(frame) {
    const cvMin = typeof frame.cvMin === "number" ? frame.cvMin : 0;
    const ready = [];
    const rest = [];
    for (const f of this._buffer) (f.cv <= cvMin ? ready : rest).push(f);
    this._buffer = rest;
    if (cvMin > this._released) this._released = cvMin;
    ready.sort((a, b) => a.cv - b.cv || a.n - b.n);
    this._release(ready);
  }

  /** Apply released frames as one step, then confirm mutations, then notify. */
  _release(frames) {
    if (!frames.length) return;
    this.stats.releases += 1;
    const touched = new Set();
    const broken = new Set();
    for (const f of frames) {
      const sub = f.sub;
      if (this._subs.get(sub.id) !== sub || sub.epoch !== f.epoch || broken.has(sub)) continue;
      try {
        if (f.seq === 0) {
          sub.tree = new Tree(f.schema);
          sub.ready = true;
          sub.error = null;
        } else if (!sub.tree) {
          continue;
        }
        for (const change of f.events) sub.tree.apply(change);
        touched.add(sub);
      } catch (err) {
        if (!(err instanceof FoldError)) throw err;
        this.stats.foldErrors += 1;
        broken.add(sub);
        touched.delete(sub);
        this._resubscribe(sub, err.message);
      }
    }
    if (touched.has(this._lmidSub)) this._confirm(this._readLmid());
    for (const sub of touched) {
      if (sub.live) sub.live._changed(sub);
      else if (sub.onRows) sub.onRows(sub);
    }
  }

  _onQueryError(msg) {
    const sub = this._subs.get(msg.queryId);
    if (!sub) return;
    if (msg.retryable !== true) {
      this._failSub(sub, msg.message || "query refused", msg.code);
      return;
    }
    // Keep the rows on screen; come back later under a new epoch.
    sub.awaitingHello = true;
    this._buffer = this._buffer.filter((f) => f.sub !== sub);
    if (sub.retryTimer !== null) return;
    const base = Math.max(msg.retryAfterMs || QUERY_RETRY_MS, 1);
    const delay = Math.min(base * 2 ** sub.retryAttempt, QUERY_RETRY_MAX_MS);
    sub.retryAttempt += 1;
    sub.retryTimer = this._timers.setTimeout(
      () => {
        sub.retryTimer = null;
        if (this._subs.get(sub.id) === sub) this._sendSubscribe(sub);
      },
      Math.round(delay * (1 + Math.random() * 0.25)),
    );
  }

  _onError(msg) {
    const sub = msg.queryId !== undefined ? this._subs.get(msg.queryId) : undefined;
    if (sub) {
      this._failSub(sub, msg.message || "subscription refused", msg.code);
      return;
    }
    if (msg.code === "client_id_taken" && this._storage) return this._renewClientID(msg);
    if (typeof msg.mid === "number" && this._onMutationError(msg)) return;
    if (msg.code === "rate_limited") this._scheduleRecovery();
    this._emit("error", msg);
  }

  /**
   * The server refused this tab's client id: another principal owns it. Continue under a
   * fresh id on a fresh socket (the old one's later answers are about the old id). Waiting
   * mutations are numbered anew; one already sent under the old id settles as rejected, as
   * it cannot be re-sent under another id without risking applying it twice.
   */
  _renewClientID(msg) {
    this.stats.clientIdRenewals += 1;
    this.clientID = this._idPrefix + renewTabClientID(this._storage, this.clientID);
    this._midKey = `rindle:mid:${this.clientID}`;
    this._memoryMid = 0;
    this.lmid = null;
    const sent = this._pending.filter((e) => e.mid !== null);
    this._pending = this._pending.filter((e) => e.mid === null);
    const reason = msg.message || msg.code;
    for (const e of sent) {
      this._emit("rejected", { mid: e.mid, name: e.name, args: e.args, reason });
      e.resolve({ mid: e.mid, rejected: true, reason });
    }
    if (sent.length) this._emit("pending", this.pending);
    this._lmidSub.tree = null;
    const ws = this._ws;
    this._ws = null;
    if (ws) ws.close();
    this._setStatus("connecting");
    this._open();
  }

  /** The server dropped a frame unread: later, send again what still waits for an answer. */
  _scheduleRecovery() {
    if (this._recoveryTimer !== null || this._closed) return;
    this._recoveryTimer = this._timers.setTimeout(() => {
      this._recoveryTimer = null;
      if (!this._isOpen()) return; // the reconnect sends everything
      for (const sub of this._subs.values()) {
        if (sub.awaitingHello && sub.retryTimer === null) this._sendSubscribe(sub);
      }
      for (const entry of this._pending) if (entry.mid !== null) this._sendEnvelope(entry);
    }, RECOVERY_MS);
  }

  _onOutcome(msg) {
    if (msg.kind !== "rejected") return;
    const entry = this._pending.find((e) => e.mid === msg.mid);
    const reason = msg.reason || "rejected";
    const why = rejection(msg);
    if (entry) {
      entry.rejected = reason;
      entry.why = why;
    }
    this._emit("rejected", {
      mid: msg.mid,
      name: entry ? entry.name : undefined,
      args: entry ? entry.args : undefined,
      reason,
      ...why,
    });
  }

  // --- mutations --------------------------------------------------------------------------

  _readLmid() {
    const tree = this._lmidSub.tree;
    if (!tree || !tree.top.length) return 0;
    let col = tree.schema.columns.indexOf("last_mutation_id");
    if (col < 0) col = 1;
    const value = Number(tree.top[0].row[col]);
    return Number.isFinite(value) ? value : 0;
  }

  _storedMid() {
    try {
      const value = Number(this._session && this._session.getItem(this._midKey));
      return Number.isFinite(value) && value > this._memoryMid ? value : this._memoryMid;
    } catch {
      return this._memoryMid;
    }
  }

  _storeMid(mid) {
    this._memoryMid = mid;
    try {
      if (this._session) this._session.setItem(this._midKey, String(mid));
    } catch {
      // storage refused: the in-memory counter still serves this page
    }
  }

  _confirm(lmid) {
    const first = this.lmid === null;
    if (first || lmid > this.lmid) this.lmid = lmid;
    if (lmid > this._storedMid()) this._storeMid(lmid);
    const done = [];
    this._pending = this._pending.filter((e) => {
      if (e.mid !== null && e.mid <= this.lmid) {
        done.push(e);
        return false;
      }
      return true;
    });
    if (done.length) {
      this._resendAttempt = 0;
      for (const e of done) {
        const result = { mid: e.mid, rejected: e.rejected !== null };
        if (e.rejected !== null) Object.assign(result, { reason: e.rejected }, e.why);
        e.resolve(result);
      }
      this._emit("pending", this.pending);
    }
    if (first) this._flushPending();
  }

  /** Give waiting mutations their mids (once the lmid is known) and send them if open. */
  _flushPending() {
    if (this.lmid === null) return;
    for (const entry of this._pending) {
      if (entry.mid !== null) continue;
      let last = Math.max(this._storedMid(), this.lmid);
      for (const e of this._pending) if (e.mid !== null && e.mid > last) last = e.mid;
      entry.mid = last + 1;
      this._storeMid(entry.mid);
      this._sendEnvelope(entry);
    }
  }

  _sendEnvelope(entry) {
    this._send({
      t: "pushMutation",
      envelope: { clientID: this.clientID, mid: entry.mid, name: entry.name, args: entry.args },
    });
  }

  /** Recover from a refused envelope; true when handled without the app's help. */
  _onMutationError(msg) {
    this.stats.mutationErrors += 1;
    const numbered = this._pending.filter((e) => e.mid !== null);
    if (msg.code === "mid_gap") {
      // Mids this page never sent lie below ours (a counter carried over from an earlier
      // page of this tab whose mutations never arrived): number ours on from the server's.
      const lmid = typeof msg.lmid === "number" ? msg.lmid : this.lmid;
      if (numbered.length && lmid !== null && numbered[0].mid > lmid + 1) {
        let mid = lmid;
        for (const e of numbered) e.mid = ++mid;
        this._storeMid(mid);
      }
      this._scheduleResend();
      return true;
    }
    if (msg.retryable) {
      this._scheduleResend();
      return true;
    }
    // Refused for good with nothing written and the lmid unchanged: settle it as
    // rejected and move the mutations behind it down one mid.
    const at = numbered.findIndex((e) => e.mid === msg.mid);
    if (at < 0) return false;
    const entry = numbered[at];
    this._pending.splice(this._pending.indexOf(entry), 1);
    const behind = numbered.slice(at + 1);
    for (const e of behind) e.mid -= 1;
    this._storeMid(behind.length ? behind[behind.length - 1].mid : msg.mid - 1);
    const reason = msg.message || msg.code || "refused";
    this._emit("rejected", { mid: msg.mid, name: entry.name, args: entry.args, reason });
    entry.resolve({ mid: msg.mid, rejected: true, reason });
    this._emit("pending", this.pending);
    if (behind.length) this._scheduleResend();
    return false;
  }

  _scheduleResend() {
    if (this._resendTimer !== null || this._closed) return;
    const delay = Math.min(RESEND_MIN_MS * 2 ** this._resendAttempt, RESEND_MAX_MS);
    this._resendAttempt += 1;
    this._resendTimer = this._timers.setTimeout(() => {
      this._resendTimer = null;
      if (!this._isOpen()) return; // the reconnect re-sends everything
      for (const entry of this._pending) if (entry.mid !== null) this._sendEnvelope(entry);
    }, delay);
  }

  // --- rooms: leases and the doorbell -----------------------------------------------------

  /** A Live's first snapshot is shown: lease it if it may be room-served. */
  _maybeLease(live) {
    const rt = this._realtime;
    if (!rt || !rt.fetch || live._rt || this._closed || !rt.queries.has(live.name)) return;
    live._rt = {
      timer: null,
      doorbell: null,
      sessions: [],
      doc: null,
      room: null,
      sub: null,
      unservable: false,
    };
    this._lease(live);
  }

  _scheduleLease(live, ms) {
    const rt = live._rt;
    if (!rt || live.closed || this._closed) return;
    this._timers.clearTimeout(rt.timer);
    rt.timer = this._timers.setTimeout(() => {
      rt.timer = null;
      this._lease(live);
    }, ms);
  }

  async _lease(live) {
    const rt = live._rt;
    const args = live.args;
    let body;
    try {
      const res = await this._realtime.fetch(this._realtime.leaseUrl, {
        method: "POST",
        credentials: "same-origin",
        headers: { "Content-Type": "application/json", "X-CSRFToken": csrfToken() },
        body: JSON.stringify({ name: live.name, args, clientId: this.clientID }),
      });
      if (res.status >= 400 && res.status < 500 && res.status !== 429) {
        // Refused for good (not allowed, no such query): the main socket serves it.
        console.warn(`rindle: the lease of ${live.name} was refused (HTTP ${res.status})`);
        return;
      }
      if (!res.ok) throw new Error(`HTTP ${res.status}`);
      body = await res.json();
    } catch (err) {
      console.warn(`rindle: leasing ${live.name} failed (${err.message}); trying again`);
      this._scheduleLease(live, LEASE_RETRY_MS);
      return;
    }
    if (live.closed || this._closed || live._rt !== rt || live.args !== args) return;
    const lifecycle = body.lifecycle || {};
    if (lifecycle.doorbell) this._ringDoorbell(live, lifecycle.doorbell);
    const block = body.realtime || null;
    if (block && rt.room && rt.room.doc !== block.doc) this._leaveRoom(live);
    if (block && !rt.unservable) this._joinRoom(live, block);
    else if (rt.room) this._leaveRoom(live);
    if (!block && lifecycle.fence && rt.doc) {
      const final = body.realtimeFence ? body.realtimeFence.finalFlushSeq : 0;
      this._watchFence(rt.doc, lifecycle.fence, final);
    }
    this._emitRealtime(live);
    let ms = LEASE_RENEW_MAX_MS;
    for (const exp of [body.expiresAt, block && block.exp]) {
      if (typeof exp === "number") ms = Math.min(ms, (exp - Date.now()) / 2);
    }
    this._scheduleLease(live, Math.max(ms, 1000));
  }

  /** Subscribe (or re-point) the lease's doorbell: the doc's sessions, on the main socket. */
  _ringDoorbell(live, bell) {
    const rt = live._rt;
    rt.doc = bell.scope || rt.doc;
    if (rt.doorbell && this._subs.get(rt.doorbell.id) === rt.doorbell) {
      rt.doorbell.lease = bell.leaseToken; // a resubscribe uses the newest token
      return;
    }
    const sub = this._addSub("_rindle/lifecycle", null, null, false, bell.leaseToken);
    sub.onRows = () => {
      const now = Date.now();
      const sessions = sub.tree
        .rows()
        .filter((r) => Number(r.expires_at) > now)
        .map((r) => r.client_id)
        .sort();
      const newcomer = sessions.some((id) => !rt.sessions.includes(id));
      rt.sessions = sessions;
      this._emitRealtime(live);
      // Another session arrived: lease again now, so that two make a room.
      if (newcomer && !rt.room && sessions.length > 1) this._scheduleLease(live, DOORBELL_SETTLE_MS);
    };
    rt.doorbell = sub;
  }

  _emitRealtime(live) {
    const rt = live._rt;
    this._emit("realtime", {
      name: live.name,
      args: live.args,
      doc: rt.doc,
      sessions: rt.sessions.slice(),
      room: !!(rt.sub && live._shown === rt.sub),
    });
  }

  /** Stop leasing ``live`` (closed, or following other arguments). */
  _forgetLease(live) {
    const rt = live._rt;
    if (!rt) return;
    live._rt = null;
    this._timers.clearTimeout(rt.timer);
    if (rt.doorbell) this._dropSub(rt.doorbell);
    if (rt.room) this._leaveRoom(live, rt);
  }

  // --- rooms: the room socket -------------------------------------------------------------

  _joinRoom(live, block) {
    const rt = live._rt;
    let room = this._rooms.get(block.doc);
    if (!room) room = this._openRoom(block);
    rt.room = room;
    if (rt.sub) {
      rt.sub.token = block.roomToken; // renewed; the subscription goes on
      return;
    }
    rt.sub = {
      id: this._nextQueryId++,
      live,
      token: block.roomToken,
      epoch: 0,
      nextSeq: 0,
      awaitingHello: true,
      tables: null,
      rows: null,
      byKey: new Map(),
      tree: null,
      ready: false,
      error: null,
    };
    room.subs.set(rt.sub.id, rt.sub);
    this._roomSubscribe(room, rt.sub);
  }

  _openRoom(block) {
    const room = {
      doc: block.doc,
      url: block.wsEndpoint,
      ws: null,
      subs: new Map(), // queryId -> room-served subscription
      lmidTables: null,
      lmidEpoch: 0,
      lmidSeq: 0,
      lmid: null,
      buffer: [],
      pending: [], // room mutations: {mid, name, args, resolve, rejected}
      midKey: `rindle:roommid:${block.doc}:${this.clientID}`,
      memoryMid: 0,
    };
    this._rooms.set(room.doc, room);
    this._adoptOrphans(room);
    const ws = new this._WebSocket(room.url);
    room.ws = ws;
    ws.onopen = () => {
      if (room.ws !== ws) return;
      this._roomSend(room, { t: "init", clientID: this.clientID });
      this._roomSend(room, { t: "subscribe", queryId: 0, name: LMID_QUERY });
      for (const sub of room.subs.values()) this._roomSubscribe(room, sub);
    };
    ws.onmessage = (event) => {
      if (room.ws !== ws) return;
      let msg;
      try {
        msg = JSON.parse(typeof event.data === "string" ? event.data : String(event.data));
      } catch {
        return;
      }
      this.stats.frames += 1;
      this._onRoomFrame(room, msg);
    };
    ws.onclose = () => {
      if (room.ws !== ws) return;
      room.ws = null;
      this._roomGone(room, true);
    };
    ws.onerror = () => {};
    return room;
  }

  _roomSend(room, msg) {
    if (!room.ws || room.ws.readyState !== OPEN) return false;
    room.ws.send(JSON.stringify(msg));
    return true;
  }

  _roomSubscribe(room, sub) {
    sub.awaitingHello = true;
    this._roomSend(room, { t: "subscribe", queryId: sub.id, leaseToken: sub.token });
  }

  /** ``live`` is served by the main socket again; the room's rows stay until its snapshot. */
  _leaveRoom(live, rt = live._rt) {
    const room = rt.room;
    const sub = rt.sub;
    rt.room = null;
    rt.sub = null;
    if (room && sub) {
      room.subs.delete(sub.id);
      room.buffer = room.buffer.filter((f) => f.sub !== sub);
      this._roomSend(room, { t: "unsubscribe", queryId: sub.id });
    }
    if (sub && live._shown === sub && !live.closed && !this._closed) {
      if (live._next) this._dropSub(live._next);
      live._next = this._addSub(live.name, live.args, live);
    }
    if (room && !room.subs.size && this._rooms.get(room.doc) === room) this._closeRoom(room);
    if (live._rt) this._emitRealtime(live);
  }

  _closeRoom(room) {
    const ws = room.ws;
    room.ws = null;
    if (ws) {
      try {
        ws.close();
      } catch {
        // already closing
      }
    }
    this._roomGone(room, false);
  }

  /** The room socket is gone: its Lives go back to the main socket, its mutations too. */
  _roomGone(room, lost) {
    if (this._rooms.get(room.doc) !== room) return;
    this._rooms.delete(room.doc);
    for (const sub of [...room.subs.values()]) {
      const live = sub.live;
      if (live._rt && live._rt.sub === sub) {
        this._leaveRoom(live);
        if (lost) this._scheduleLease(live, DOORBELL_SETTLE_MS); // a new host may take it
      }
    }
    // What the room never received goes on the main path. What it was sent stays in
    // the room's domain under its mid: the room may have flushed it and died before the
    // confirmation reached this tab, so the main path could apply it twice.
    const moved = room.pending;
    room.pending = [];
    const sent = moved.filter((e) => e.mid !== null);
    for (const e of moved) if (e.mid === null) this._pending.push({ ...e, mid: null });
    if (sent.length) {
      const held = this._orphans.get(room.doc) || { entries: [], fence: null, stuck: false };
      held.entries.push(...sent);
      held.entries.sort((a, b) => a.mid - b.mid);
      this._orphans.set(room.doc, held);
    }
    if (moved.length > sent.length && !this._closed) this._flushPending();
  }

  // --- rooms: mutations a lost room was sent --------------------------------------------

  /** A new room of ``doc`` takes back what the last one was sent but never confirmed. */
  _adoptOrphans(room) {
    const held = this._orphans.get(room.doc);
    if (!held) return;
    this._orphans.delete(room.doc);
    this._dropFence(held);
    room.pending.push(...held.entries);
  }

  /**
   * A lease of ``doc`` without a room, carrying the fence streams (a downgrade): watch
   * them on the main socket to resolve the sent mutations the room held. Once the
   * room's watermark reached ``finalFlushSeq`` its ledger is final: a mid it covers
   * was applied, or refused as its outcome row says (a deopt is sent on the main path);
   * a mid past it never reached the room and cannot be decided: it stays pending and
   * an ``error`` event (``room_mutation_undecided``) names it once.
   */
  _watchFence(doc, fence, finalFlushSeq) {
    const held = this._orphans.get(doc);
    if (!held || held.fence) return;
    const streams = {};
    for (const entry of fence) {
      const sub = this._addSub("_rindle/lifecycle", null, null, false, entry.leaseToken);
      sub.onRows = () => this._resolveOrphans(doc);
      streams[entry.table] = sub;
    }
    held.fence = { streams, finalFlushSeq: Number(finalFlushSeq) || 0 };
  }

  _dropFence(held) {
    if (!held.fence) return;
    for (const sub of Object.values(held.fence.streams)) this._dropSub(sub);
    held.fence = null;
  }

  _resolveOrphans(doc) {
    const held = this._orphans.get(doc);
    if (!held || !held.fence) return;
    const { streams, finalFlushSeq } = held.fence;
    const rows = (table) => {
      const sub = streams[table];
      return sub && sub.ready && sub.tree ? sub.tree.rows() : null;
    };
    const marks = rows(ROOM_WATERMARK);
    const ledger = rows(ROOM_LEDGER);
    const outcomes = rows(ROOM_OUTCOMES);
    if (!marks || !ledger || !outcomes) return; // every stream's snapshot first
    const mark = marks.find((r) => r.doc === doc);
    if ((mark ? Number(mark.flush_seq) : 0) < finalFlushSeq) return; // the fence holds
    const mine = ledger.find((r) => r.doc === doc && r.client_id === this.clientID);
    const lmid = mine ? Number(mine.last_mutation_id) : 0;
    const outcome = new Map();
    for (const r of outcomes) {
      if (r.doc === doc && r.client_id === this.clientID) outcome.set(Number(r.mid), r);
    }
    const left = [];
    let rerouted = false;
    for (const e of held.entries) {
      if (e.mid > lmid) {
        left.push(e);
        continue;
      }
      const o = outcome.get(e.mid);
      if (o && o.kind === "deopt") {
        this._pending.push({ ...e, mid: null });
        rerouted = true;
      } else if (o) {
        const reason = o.reason || e.rejected || "rejected";
        this._emit("rejected", { mid: e.mid, name: e.name, args: e.args, reason });
        e.resolve({ mid: e.mid, rejected: true, reason });
      } else {
        e.resolve({ mid: e.mid, rejected: false });
      }
    }
    held.entries = left;
    if (!left.length) {
      this._orphans.delete(doc);
      this._dropFence(held);
    } else if (!held.stuck) {
      held.stuck = true;
      const mids = left.map((e) => e.mid);
      console.warn(`rindle: room mutations ${mids} of ${doc} never reached its room; held`);
      this._emit("error", { code: "room_mutation_undecided", doc, mids });
    }
    this._emit("pending", this.pending);
    if (rerouted) this._flushPending();
  }

  // --- rooms: frames ----------------------------------------------------------------------

  _onRoomFrame(room, msg) {
    switch (msg && msg.t) {
      case "nhello":
        return this._onRoomHello(room, msg);
      case "nbatch":
        return this._onRoomBatch(room, msg);
      case "progress":
        return this._onRoomProgress(room, (msg.frame || {}).cvMin);
      case "mutationOutcome":
        return this._onRoomOutcome(room, msg);
      case "queryError":
      case "error":
        return this._onRoomError(room, msg);
      default:
        return undefined;
    }
  }

  _onRoomHello(room, msg) {
    const hello = msg.hello || {};
    if (msg.queryId === 0) {
      room.lmidTables = hello.tables || [];
      room.lmidEpoch = hello.epoch;
      room.lmidSeq = 0;
      room.buffer = room.buffer.filter((f) => f.sub !== null);
      return;
    }
    const sub = room.subs.get(msg.queryId);
    if (!sub || hello.epoch < sub.epoch) return;
    const live = sub.live;
    const schema = live._shown && live._shown.schema;
    const tables = hello.tables || [];
    if (!schema || schema.relationships.length || tables.length !== 1) {
      // Joining normalized rows needs the query's correlations: stay on the main socket.
      console.warn(`rindle: ${live.name} has relationships; it is not served from the room`);
      live._rt.unservable = true; // renewals keep the doorbell, and join no room
      this._leaveRoom(live);
      return;
    }
    sub.epoch = hello.epoch;
    sub.tables = tables[0];
    sub.schema = schema;
    sub.nextSeq = 0;
    sub.awaitingHello = false;
    room.buffer = room.buffer.filter((f) => f.sub !== sub);
  }

  _onRoomBatch(room, msg) {
    const batch = msg.batch || {};
    const lmid = msg.queryId === 0;
    const sub = lmid ? null : room.subs.get(msg.queryId);
    if (!lmid && (!sub || sub.awaitingHello)) return;
    const epoch = lmid ? room.lmidEpoch : sub.epoch;
    const next = lmid ? room.lmidSeq : sub.nextSeq;
    if (batch.epoch !== epoch || batch.seq < next) {
      this.stats.duplicates += 1;
      return;
    }
    if (batch.seq > next) {
      this.stats.gaps += 1;
      if (lmid) this._roomSend(room, { t: "subscribe", queryId: 0, name: LMID_QUERY });
      else this._roomSubscribe(room, sub);
      return;
    }
    if (lmid) room.lmidSeq = batch.seq + 1;
    else sub.nextSeq = batch.seq + 1;
    room.buffer.push({ sub, seq: batch.seq, cv: batch.cv || 0, ops: batch.ops || [] });
  }

  /** Apply the room's released frames as one step, then confirm room mutations, then notify. */
  _onRoomProgress(room, cvMin) {
    const ready = room.buffer.filter((f) => f.cv <= cvMin);
    room.buffer = room.buffer.filter((f) => f.cv > cvMin);
    const touched = new Set();
    let lmid = null;
    for (const f of ready) {
      if (f.sub === null) {
        lmid = readRoomLmid(room.lmidTables, f.ops, f.seq === 0 ? 0 : room.lmid);
        continue;
      }
      if (room.subs.get(f.sub.id) !== f.sub) continue;
      if (f.seq === 0) f.sub.rows = new Map();
      if (!f.sub.rows) continue;
      foldRoomOps(f.sub.rows, f.sub.tables, f.ops);
      touched.add(f.sub);
    }
    if (ready.length) this.stats.releases += 1;
    if (lmid !== null) this._confirmRoom(room, lmid);
    for (const sub of touched) {
      sub.tree = roomTree(sub.schema, sub.tables, sub.rows, sub.byKey);
      sub.ready = true;
      const live = sub.live;
      if (live._shown !== sub) {
        // The room's first snapshot: serve the Live from it, drop the main subscription.
        if (live._next) this._dropSub(live._next);
        live._next = null;
        const old = live._shown;
        live._shown = sub;
        if (old) this._dropSub(old);
        this._emitRealtime(live);
      }
      live._changed(sub);
    }
  }

  _onRoomOutcome(room, msg) {
    const entry = room.pending.find((e) => e.mid === msg.mid);
    if (msg.kind === "deopt") {
      // The room cannot apply it: the main path does.
      if (!entry) return;
      room.pending.splice(room.pending.indexOf(entry), 1);
      this._pending.push({ ...entry, mid: null });
      this._flushPending();
      return;
    }
    if (msg.kind !== "rejected") return;
    const reason = msg.reason || "rejected";
    if (entry) entry.rejected = reason;
    this._emit("rejected", {
      mid: msg.mid,
      name: entry ? entry.name : msg.name,
      args: entry ? entry.args : msg.args,
      reason,
    });
  }

  _onRoomError(room, msg) {
    const sub = typeof msg.queryId === "number" ? room.subs.get(msg.queryId) : undefined;
    if (sub) {
      console.warn(`rindle: the room refused ${sub.live.name}: ${msg.message}`);
      this._leaveRoom(sub.live);
      return;
    }
    const entry = typeof msg.mid === "number" && room.pending.find((e) => e.mid === msg.mid);
    if (entry) {
      // The host refused the envelope itself: the main path decides.
      room.pending.splice(room.pending.indexOf(entry), 1);
      this._pending.push({ ...entry, mid: null });
      this._flushPending();
      return;
    }
    this._emit("error", msg);
  }

  // --- rooms: mutations -------------------------------------------------------------------

  /** The room a declared room mutator goes to: the one open room (null: the main path). */
  _mutationRoom(name) {
    if (!this._realtime || !this._realtime.mutators.has(name) || this._rooms.size !== 1) {
      return null;
    }
    const room = this._rooms.values().next().value;
    for (const sub of room.subs.values()) if (sub.ready && sub.live._shown === sub) return room;
    return null;
  }

  _mutateInRoom(room, name, args) {
    return new Promise((resolve) => {
      room.pending.push({ mid: null, name, args, resolve, rejected: null });
      this._emit("pending", this.pending);
      this._flushRoomPending(room);
    });
  }

  _flushRoomPending(room) {
    if (room.lmid === null) return;
    for (const entry of room.pending) {
      if (entry.mid !== null) continue;
      let last = Math.max(storedNumber(this._session, room.midKey, room.memoryMid), room.lmid);
      for (const e of room.pending) if (e.mid !== null && e.mid > last) last = e.mid;
      entry.mid = last + 1;
      room.memoryMid = entry.mid;
      storeNumber(this._session, room.midKey, entry.mid);
      this._roomSend(room, {
        t: "pushMutation",
        envelope: { clientID: this.clientID, mid: entry.mid, name: entry.name, args: entry.args },
      });
    }
  }

  _confirmRoom(room, lmid) {
    const first = room.lmid === null;
    if (first || lmid > room.lmid) room.lmid = lmid;
    const done = room.pending.filter((e) => e.mid !== null && e.mid <= room.lmid);
    if (done.length) {
      room.pending = room.pending.filter((e) => !done.includes(e));
      for (const e of done) {
        const result = { mid: e.mid, rejected: e.rejected !== null };
        if (e.rejected !== null) result.reason = e.rejected;
        e.resolve(result);
      }
      this._emit("pending", this.pending);
    }
    if (first) {
      // Taken back from a lost room: sent again under their mids, in order (the room
      // absorbs any it already made durable as a replay).
      for (const e of room.pending) {
        if (e.mid === null) continue;
        this._roomSend(room, {
          t: "pushMutation",
          envelope: { clientID: this.clientID, mid: e.mid, name: e.name, args: e.args },
        });
      }
      this._flushRoomPending(room);
    }
  }
}

// --- rooms: helpers -----------------------------------------------------------------------

function csrfToken() {
  const match = /(?:^|;\s*)csrftoken=([^;]+)/.exec((globalThis.document && document.cookie) || "");
  return match ? decodeURIComponent(match[1]) : "";
}

function storedNumber(area, key, floor) {
  try {
    const value = Number(area && area.getItem(key));
    return Number.isFinite(value) && value > floor ? value : floor;
  } catch {
    return floor;
  }
}

function storeNumber(area, key, value) {
  try {
    if (area) area.setItem(key, String(value));
  } catch {
    // storage refused: the in-memory counter serves this page
  }
}

function roomKey(table, row) {
  return JSON.stringify(table.primaryKey.map((i) => row[i]));
}

/** Fold normalized ops (`{op, row}` / `{op: "edit", old, new}`, rows positional) by key. */
function foldRoomOps(rows, table, ops) {
  for (const op of ops) {
    if (op.op === "add") rows.set(roomKey(table, op.row), op.row);
    else if (op.op === "remove") rows.delete(roomKey(table, op.row));
    else if (op.op === "edit") {
      rows.delete(roomKey(table, op.old));
      rows.set(roomKey(table, op.new), op.new);
    }
  }
}

/** The room lmid after a lmid stream frame's ops (`last` before them). */
function readRoomLmid(tables, ops, last) {
  const table = (tables || [])[0];
  let col = table ? table.columns.indexOf("last_mutation_id") : -1;
  if (col < 0) col = 1;
  let lmid = last || 0;
  for (const op of ops) {
    const row = op.op === "edit" ? op.new : op.op === "add" ? op.row : null;
    if (row && Number.isFinite(Number(row[col]))) lmid = Number(row[col]);
  }
  return lmid;
}

/**
 * A Tree of a relationship-free query's rows from the room: positional as the flat level's
 * columns, in its sort. Nodes of unchanged rows are kept (`byKey`), so their objects are.
 */
function roomTree(schema, table, rows, byKey) {
  const at = schema.columns.map((name) => table.columns.indexOf(name));
  const seen = new Map();
  const top = [];
  for (const [key, cells] of rows) {
    const row = at.map((i) => (i < 0 ? undefined : cells[i]));
    let node = byKey.get(key);
    if (!node || !sameRow(node.row, row)) node = { row, rc: 1, kids: [], out: null };
    seen.set(key, node);
    top.push(node);
  }
  byKey.clear();
  for (const [key, node] of seen) byKey.set(key, node);
  top.sort((a, b) => compareRows(a.row, b.row, schema.sort));
  const tree = new Tree(schema);
  tree.top = top;
  return tree;
}

// --- a live query --------------------------------------------------------------------------

export class Live {
  constructor(conn, name, args, onChange) {
    this.conn = conn;
    this.name = name;
    this.args = args;
    this.onChange = onChange;
    this.closed = false;
    this._next = null;
    this._rt = null; // the lease and room state of a realtime query (Connection._maybeLease)
    this._shown = conn._closed ? null : conn._addSub(name, args, this);
  }

  get rows() {
    const tree = this._shown && this._shown.tree;
    return tree ? tree.rows() : EMPTY;
  }

  get row() {
    return this.rows.length ? this.rows[0] : null;
  }

  get ready() {
    return !!(this._shown && this._shown.ready);
  }

  get error() {
    return (this._next && this._next.error) || (this._shown && this._shown.error) || null;
  }

  /** Follow the same query with other arguments; the current rows stay until the new ones. */
  setArgs(args) {
    const value = args === undefined ? null : args;
    if (this.closed || JSON.stringify(value) === JSON.stringify(this.args)) return;
    this.conn._forgetLease(this); // leased again once the new rows are shown
    this.args = value;
    if (this._next) this.conn._dropSub(this._next);
    this._next = this.conn._addSub(this.name, value, this);
  }

  close() {
    if (this.closed) return;
    this.closed = true;
    this.conn._forgetLease(this);
    if (this._next) this.conn._dropSub(this._next);
    if (this._shown) this.conn._dropSub(this._shown);
    this._next = null;
  }

  _changed(sub) {
    if (this.closed) return;
    if (sub === this._next) {
      if (!sub.ready && !sub.error) return;
      if (sub.ready) {
        const old = this._shown;
        this._shown = sub;
        this._next = null;
        if (old) this.conn._dropSub(old);
      }
    } else if (sub !== this._shown) {
      return;
    }
    if (this.ready) this.conn._maybeLease(this);
    if (this.onChange) {
      try {
        this.onChange(this.rows, this);
      } catch (err) {
        console.error(`rindle: onChange of ${this.name} failed`, err);
      }
    }
  }
}
