"""
Record the frames of a real session for the JS fold test (not a test itself).

    .venv/bin/python tests/e2e/browser/record_fixture.py http://127.0.0.1:8000

against a running demo (``make demo``). In Chromium it signs in as ``ada``, opens
one connection with three live queries, makes a dozen edits through the demo's
mutators, then asks a second connection for the same queries. It writes every frame
the first connection received, and the second connection's rows, to
``tests/e2e/browser/js/fixtures/session.json``: folding the first must give the second.
"""

import json
import sys
from pathlib import Path

from chromium import CHROMIUM, CHROMIUM_ARGS  # run as a script: tests/e2e/browser is on the path
from playwright.sync_api import sync_playwright

OUT = Path(__file__).parent / "js" / "fixtures" / "session.json"

# Every socket's received text frames, by socket number.
RECORD_SOCKETS = """
window.__sockets = [];
const Native = window.WebSocket;
window.WebSocket = class extends Native {
  constructor(...args) {
    super(...args);
    const frames = [];
    window.__sockets.push(frames);
    this.addEventListener("message", (e) => frames.push(JSON.parse(e.data)));
  }
};
"""

SESSION = """
async () => {
  const { connect } = await import("/static/rindle/rindle.js");
  const QUERIES = [
    ["issuesPage", { limit: 5 }],
    ["issuesPage", { limit: 3, filter: [{ axis: "status", value: "todo" }] }],
    ["myIssues", { limit: 4 }],
  ];
  const ready = (conn) => Promise.all(QUERIES.map(([name, args]) => conn.query(name, args)));
  const conn = connect();
  const lives = QUERIES.map(([name, args]) => conn.subscribe(name, args, () => {}));
  while (!lives.every((live) => live.ready)) await new Promise((r) => setTimeout(r, 20));
  const top = lives[0].rows[0].id;
  const stamp = Date.now();
  const id = `rec${stamp}`;
  const t = (n) => stamp + n;
  const steps = [
    ["editTitle", { id: top, title: "Recorded: renamed", updatedAt: t(1) }],
    ["addComment", { id: `${id}-c1`, issueId: top, body: "recorded comment", createdAt: t(2) }],
    ["addTag", { id: `${id}-t1`, issueId: top, name: "recorded", updatedAt: t(3) }],
    ["setStatus", { id: top, status: "todo", updatedAt: t(4) }],
    ["setPriority", { id: top, priority: "urgent", updatedAt: t(5) }],
    ["setOwner", { id: top, owner: "ada", updatedAt: t(6) }],
    ["createIssue", { id, title: "Recorded: created", status: "todo", priority: "low",
      owner: "ada", tags: [{ id: `${id}-t2`, name: "zeta" }, { id: `${id}-t3`, name: "alpha" }],
      description: "made by the recorder", descriptionCommentId: `${id}-c0`, createdAt: t(7) }],
    ["editComment", { id: `${id}-c1`, issueId: top, body: "recorded comment, edited",
      updatedAt: t(7) }],
    ["removeTag", { id: `${id}-t1`, issueId: top, updatedAt: t(8) }],
    ["setTitleSpam", null],
    ["deleteIssue", { id }],
    ["setStatus", { id: top, status: "done", updatedAt: t(9) }],
  ];
  for (const [name, args] of steps) {
    if (name === "setTitleSpam") {
      await conn.mutate("editTitle", { id: top, title: "spam spam", updatedAt: t(10) });
      continue;
    }
    await conn.mutate(name, args);
  }
  await new Promise((r) => setTimeout(r, 300));
  const other = connect();
  const expected = await ready(other);
  other.close();
  conn.close();
  return { queries: QUERIES, expected, stats: conn.stats };
}
"""


def main(base):
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        page = browser.new_page()
        page.goto(f"{base}/signin/")
        page.fill("input[name=username]", "ada")
        page.click("#signin button[type=submit]")
        page.wait_for_load_state()
        page.add_init_script(RECORD_SOCKETS)
        page.goto(f"{base}/signin/")
        result = page.evaluate(SESSION)
        frames = page.evaluate("window.__sockets[0]")
        browser.close()
    OUT.parent.mkdir(parents=True, exist_ok=True)
    OUT.write_text(json.dumps({**result, "frames": frames}, indent=1) + "\n")
    print(f"{len(frames)} frames, stats {result['stats']} -> {OUT}")


if __name__ == "__main__":
    main(sys.argv[1].rstrip("/") if len(sys.argv) > 1 else "http://127.0.0.1:8000")
