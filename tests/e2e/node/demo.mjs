// The demo issue tracker as a client of the published packages sees it: the typed schema,
// client twins of the server's named queries (project/demo/queries.py) and client mutators
// predicting the server's (project/demo/mutators.py).
//
// A twin builds the same AST the server resolves, so the local engine materializes, from
// the rows the server syncs, the view the server computes. Server-only rules (the spam
// check, the same-name tag check, the owner gate on deleteIssue, the author gate on
// editComment) are deliberately left out of the predictions: a prediction the server
// refuses, or accepts as a no-op, must snap back.

import { createSchema, defineQuery, exists, ilike, number, queries, string, table } from "@rindle/remote";

export const user = table("user").columns({ id: string(), name: string() }).primaryKey("id");
export const issue = table("issue")
  .columns({
    id: string(),
    title: string(),
    status: string(),
    priority: string(),
    ownerId: string(),
    createdAt: number(),
    updatedAt: number(),
  })
  .primaryKey("id");
export const tag = table("tag").columns({ id: string(), issueId: string(), name: string() }).primaryKey("id");
export const comment = table("comment")
  .columns({ id: string(), issueId: string(), authorId: string(), body: string(), createdAt: number() })
  .primaryKey("id");

export const schema = createSchema({ tables: [user, issue, tag, comment] });
const q = queries(schema);

const ISSUE_OWNER = { parent: ["ownerId"], child: ["id"] };
const ISSUE_CHILDREN = { parent: ["id"], child: ["issueId"] };
const COMMENT_AUTHOR = { parent: ["authorId"], child: ["id"] };
const COMMENT_ISSUE = { parent: ["issueId"], child: ["id"] };

const userBadge = (u) => u.select("id", "name");

function issueChrome(query) {
  return query
    .select("id", "title", "status", "priority", "ownerId")
    .sub("owner", user, ISSUE_OWNER, (u) => userBadge(u).one())
    .sub("tags", tag, ISSUE_CHILDREN, (t) => t.select("id", "name").orderBy("name", "asc"));
}

function issueCard(query) {
  return issueChrome(query).select("updatedAt").countAs("commentCount", comment, ISSUE_CHILDREN);
}

function commentCard(query) {
  return query.select("id", "authorId", "body", "createdAt").sub("author", user, COMMENT_AUTHOR, (u) => userBadge(u).one());
}

const newestFirst = (query) => query.orderBy("createdAt", "desc").orderBy("id", "asc");

function contains(value) {
  return `%${value.replace(/\\/g, "\\\\").replace(/%/g, "\\%").replace(/_/g, "\\_")}%`;
}

function filtered(query, term) {
  const { axis, value } = term;
  if (axis === "title") return query.where.title(ilike(contains(value)));
  if (axis === "status" || axis === "priority") return query.where[axis](value);
  if (axis === "owner") return query.where(exists(user, ISSUE_OWNER, (u) => u.where.name(ilike(contains(value)))));
  if (axis === "tag") return query.where(exists(tag, ISSUE_CHILDREN, (t) => t.where.name(ilike(contains(value)))));
  return query.where(exists(comment, ISSUE_CHILDREN, (c) => c.where.body(ilike(contains(value)))));
}

export const issuesPage = defineQuery("issuesPage", (args) => {
  let query = q.issue;
  for (const term of args.filter ?? []) query = filtered(query, term);
  return issueCard(newestFirst(query)).limit(args.limit);
});

export const myIssues = defineQuery("myIssues", (args, ctx) =>
  issueCard(newestFirst(q.issue.where.ownerId(ctx.user ?? ""))).limit(args.limit),
);

// Realtime-labelled, as the server's issueDetail is: its lease carries the lifecycle streams.
export const issueDetail = defineQuery(
  "issueDetail",
  (issueId) =>
    issueChrome(q.issue.where.id(issueId))
      .select("updatedAt")
      .sub("comments", comment, ISSUE_CHILDREN, (c) => commentCard(c).orderBy("createdAt", "asc").orderBy("id", "asc"))
      .one(),
  { realtime: { room: "issue" } },
);

export const recentComments = defineQuery("recentComments", (args) =>
  commentCard(newestFirst(q.comment))
    .sub("issue", issue, COMMENT_ISSUE, (i) => i.select("id", "title", "status").one())
    .limit(args.limit),
);

export const users = defineQuery("users", () => q.user.orderBy("name", "asc"));

export const tagOptions = defineQuery("tagOptions", () => q.tag.select("name").orderBy("name", "asc"));

export const NAMED = { issuesPage, myIssues, issueDetail, recentComments, users, tagOptions };

/** Client mutators (predictions) for an acting user id (`""` when anonymous). */
export function mutators(actingUser) {
  const touch = (tx, id, changes, updatedAt) => tx.update("issue", { id, ...changes, updatedAt });
  const ensureUser = (tx, id) => tx.insertIgnore("user", { id, name: id });
  return {
    createIssue(tx, a) {
      const owner = a.owner || "unassigned";
      ensureUser(tx, owner);
      ensureUser(tx, actingUser);
      tx.insert("issue", {
        id: a.id,
        title: a.title,
        status: a.status,
        priority: a.priority,
        ownerId: owner,
        createdAt: a.createdAt,
        updatedAt: a.createdAt,
      });
      tx.insert("comment", {
        id: a.descriptionCommentId,
        issueId: a.id,
        authorId: actingUser,
        body: a.description,
        createdAt: a.createdAt,
      });
      for (const t of a.tags ?? []) tx.insert("tag", { id: t.id, issueId: a.id, name: t.name });
    },
    editTitle(tx, a) {
      touch(tx, a.id, { title: a.title }, a.updatedAt);
    },
    setStatus(tx, a) {
      touch(tx, a.id, { status: a.status }, a.updatedAt);
    },
    setPriority(tx, a) {
      touch(tx, a.id, { priority: a.priority }, a.updatedAt);
    },
    setOwner(tx, a) {
      ensureUser(tx, a.owner);
      touch(tx, a.id, { ownerId: a.owner }, a.updatedAt);
    },
    addTag(tx, a) {
      if (!tx.row("issue", { id: a.issueId })) return;
      tx.insertIgnore("tag", { id: a.id, issueId: a.issueId, name: a.name });
      touch(tx, a.issueId, {}, a.updatedAt);
    },
    removeTag(tx, a) {
      tx.delete("tag", { id: a.id });
      touch(tx, a.issueId, {}, a.updatedAt);
    },
    deleteIssue(tx, a) {
      for (const c of tx.query(q.comment.where.issueId(a.id))) tx.delete("comment", { id: c.id });
      for (const t of tx.query(q.tag.where.issueId(a.id))) tx.delete("tag", { id: t.id });
      tx.delete("issue", { id: a.id });
    },
    addComment(tx, a) {
      if (!tx.row("issue", { id: a.issueId })) return;
      ensureUser(tx, actingUser);
      tx.insert("comment", { id: a.id, issueId: a.issueId, authorId: actingUser, body: a.body, createdAt: a.createdAt });
      touch(tx, a.issueId, {}, a.updatedAt ?? a.createdAt);
    },
    // The server bumps the comment's own issue, so the prediction reads it from the row.
    editComment(tx, a) {
      const c = tx.row("comment", { id: a.id });
      if (!c) return;
      tx.update("comment", { id: a.id, body: a.body });
      touch(tx, c.issueId, {}, a.updatedAt);
    },
  };
}
