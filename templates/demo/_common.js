// Shared by every demo page (included into each page's module script).
const ME = JSON.parse(document.getElementById("me-data").textContent);
const STATUSES = JSON.parse(document.getElementById("statuses-data").textContent);
const PRIORITIES = JSON.parse(document.getElementById("priorities-data").textContent);

function h(tag, attrs, ...children) {
  const el = document.createElement(tag);
  for (const [key, value] of Object.entries(attrs || {})) {
    if (value === null || value === undefined || value === false) continue;
    if (key.startsWith("on")) el.addEventListener(key.slice(2), value);
    else if (key === "dataset") Object.assign(el.dataset, value);
    else if (key in el && key !== "list") el[key] = value;
    else el.setAttribute(key, value === true ? "" : value);
  }
  for (const child of children.flat()) {
    if (child === null || child === undefined || child === false) continue;
    el.append(child instanceof Node ? child : String(child));
  }
  return el;
}

function toast(message, kind = "info") {
  const el = h("div", { className: `toast ${kind}` }, message);
  document.getElementById("toasts").append(el);
  setTimeout(() => el.remove(), 5000);
}

const conn = connect({
  ...PAGE_OPTIONS,
  onStatus(status) {
    const el = document.getElementById("conn-status");
    el.dataset.status = status;
    el.textContent = { open: "live", connecting: "connecting…", closed: "offline" }[status];
  },
  onPending(count) {
    const el = document.getElementById("pending");
    el.dataset.count = String(count);
    el.hidden = count === 0;
    el.textContent = `saving ${count}…`;
  },
  onRejected({ name, reason }) {
    toast(`${name || "change"} was refused: ${reason}`, "bad");
  },
  onError({ message }) {
    toast(message, "bad");
  },
});
window.rindle = conn; // for the console and the browser test

function newId(prefix) {
  const bytes = new Uint8Array(6);
  crypto.getRandomValues(bytes);
  const rand = Array.from(bytes, (b) => b.toString(16).padStart(2, "0")).join("");
  return `${prefix}${Date.now().toString(36)}${rand}`;
}

function ago(ms) {
  const s = Math.max(0, (Date.now() - ms) / 1000);
  if (s < 60) return "just now";
  if (s < 3600) return `${Math.floor(s / 60)} min ago`;
  if (s < 86400) return `${Math.floor(s / 3600)} h ago`;
  if (s < 86400 * 60) return `${Math.floor(s / 86400)} d ago`;
  return new Date(ms).toISOString().slice(0, 10);
}

function issueUrl(id) {
  return `/issues/${encodeURIComponent(id)}/`;
}

function statusBadge(status) {
  return h("span", { className: `status s-${status}` }, status);
}

function priorityBadge(priority) {
  return h("span", { className: `priority p-${priority}` }, priority);
}

function ownerName(issue) {
  return issue.owner ? issue.owner.name : issue.ownerId;
}

function tagChips(tags) {
  return h("span", { className: "tags" }, (tags || []).map((t) => h("span", { className: "tag" }, t.name)));
}

// Keep one element per key, in the rows' order, rebuilding only rows whose object changed
// (the client reuses the objects of unchanged rows), so focus and open editors survive.
function renderKeyed(container, rows, key, build) {
  const old = new Map();
  for (const el of Array.from(container.children)) if (el.dataset.key) old.set(el.dataset.key, el);
  let at = 0;
  for (const row of rows) {
    const k = String(key(row));
    let el = old.get(k);
    old.delete(k);
    if (!el || el._row !== row) {
      const fresh = build(row, el);
      if (el && fresh !== el) el.replaceWith(fresh);
      el = fresh;
      el.dataset.key = k;
      el._row = row;
    }
    if (container.children[at] !== el) container.insertBefore(el, container.children[at] || null);
    at += 1;
  }
  for (const el of old.values()) el.remove();
}

function optionList(select, values, current, label = (v) => v) {
  const wanted = values.map(String).join("\u0000");
  if (select.dataset.options !== wanted) {
    select.replaceChildren(...values.map((v) => h("option", { value: v }, label(v))));
    select.dataset.options = wanted;
  }
  if (current !== undefined && select.value !== current) select.value = current;
}
