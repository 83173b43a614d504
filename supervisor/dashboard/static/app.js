// The dashboard's page: draws what the server pushes on its event stream (no polling of the
// board), and sends actions as same-origin POSTs. Every text from the board goes in with
// textContent, never as markup: a title `<script>` is shown, not run.
"use strict";

const STATUSES = ["todo", "doing", "blocked", "done", "failed", "cancelled"];
const state = { picture: null, open: null, log: null };
const $ = (id) => document.getElementById(id);

function el(tag, attrs, ...children) {
  const node = document.createElement(tag);
  for (const [key, value] of Object.entries(attrs || {})) {
    if (key === "class") node.className = value;
    else if (key.startsWith("data-")) node.setAttribute(key, value);
    else if (key === "onclick") node.addEventListener("click", value);
    else node[key] = value;
  }
  for (const child of children) {
    if (child === null || child === undefined) continue;
    node.append(typeof child === "string" ? document.createTextNode(child) : child);  // text, never HTML
  }
  return node;
}

function age(iso) {
  const at = Date.parse(iso);
  if (!iso || Number.isNaN(at)) return "";
  const s = Math.max(0, (Date.now() - at) / 1000);
  if (s < 60) return `${Math.round(s)}s`;
  if (s < 3600) return `${Math.round(s / 60)}m`;
  if (s < 86400) return `${(s / 3600).toFixed(1)}h`;
  return `${(s / 86400).toFixed(1)}d`;
}

const dollars = (v) => (typeof v === "number" ? `$${v.toFixed(4)}` : "");

// The server's clock minus this one's (seconds), from the picture's `at`: a lease is counted down
// on the server's clock, whatever this machine's says.
function serverNow() { return Date.now() / 1000 + (state.skew || 0); }

function leaseLeft(until) {
  const ts = Number(until);
  if (!until || !Number.isFinite(ts)) return "";
  const s = ts - serverNow();
  if (s <= 0) return "lease run out";
  return `lease ${s < 120 ? `${Math.round(s)}s` : `${Math.round(s / 60)}m`} left`;
}

function say(text, kind) {
  const box = $("message");
  box.textContent = text;
  box.dataset.kind = kind || "info";
  box.hidden = !text;
}

// -- the board ---------------------------------------------------------------------------------

function card(item, costs) {
  const who = [item.role && `role ${item.role}`, item.assignee && `for ${item.assignee}`].filter(Boolean).join(", ");
  const cost = costs[item.id] ? dollars(costs[item.id].cost_usd) : "";
  const attempt = item.attempts ? `attempt ${item.attempts}/${item.max_attempts ?? "?"}` : "";
  const node = el("div", { class: "card", "data-id": item.id, tabIndex: 0 },
    el("div", { class: "title" }, String(item.title)),
    el("div", { class: "meta" }, [item.id, who].filter(Boolean).join(" · ")),
    el("div", { class: "meta" },
      ...[item.agent && `@${item.agent}${item.host ? " on " + item.host : ""}`, attempt, el("span", { class: "age", "data-at": item.created_at || "" },
        age(item.created_at)), cost].filter(Boolean).flatMap((part, i) => (i ? [" · ", part] : [part]))),
    item.status === "doing" && item.lease_until_ts
      ? el("div", { class: "meta lease", "data-until": String(item.lease_until_ts) }, leaseLeft(item.lease_until_ts)) : null,
    item.waiting ? el("div", { class: "why" }, `waiting: ${item.waiting}`) : null,
    (item.status === "failed" || item.status === "blocked") && item.error ? el("div", { class: "err" }, String(item.error)) : null);
  node.addEventListener("click", () => openTask(item.id));
  node.addEventListener("keydown", (e) => { if (e.key === "Enter") openTask(item.id); });
  return node;
}

const number = (n) => Number(n).toLocaleString("en-US");

// The server ships each column's first cards only (the next to move, the newest finished) with the
// column's whole count: a column that holds more says how many it shows.
function drawBoard(board, usage) {
  const costs = (usage && usage.tasks) || {};
  const columns = STATUSES.map((status) => {
    const items = board.columns[status] || [];
    const total = board.counts[status] ?? items.length;
    return el("div", { class: "column", "data-status": status },
      el("h2", {}, status, el("span", { class: "count" }, String(total))),
      ...items.map((item) => card(item, costs)),
      total > items.length ? el("div", { class: "more" }, `showing ${number(items.length)} of ${number(total)}`) : null);
  });
  $("board").replaceChildren(...columns);
}

function agentButton(name, command) {
  return el("button", { type: "button", class: "ghost", "data-command": command,
    onclick: () => act(`/api/agent/${encodeURIComponent(name)}/${command}`, {}, `${command} ${name}`) }, command);
}

// Every host's agents: this one's from its supervisor (with the buttons, which command it), the
// others' as their supervisors published them with their heartbeats, marked when that host fell silent.
function drawAgents(agents) {
  const rows = agents.map((a) => el("tr", { "data-agent": String(a.name), "data-host": String(a.host || ""),
      "data-silent": a.silent ? "yes" : "no", class: a.silent ? "silent" : "" },
    el("td", {}, String(a.name)), el("td", { class: "host" }, String(a.host || "")),
    el("td", { class: "pid" }, a.pid ? String(a.pid) : "-"),
    el("td", { class: "state" }, String(a.state ?? "-") + (a.held ? " (held)" : "") + (a.silent ? " (host silent)" : "")),
    el("td", { class: "restarts" }, String(a.restarts ?? 0)),
    el("td", {}, el("span", { class: "age", "data-at": a.heartbeat || "" }, age(a.heartbeat))),
    el("td", { class: "task" }, a.task ? String(a.task) : ""), el("td", {}, a.rss_mb != null ? `${a.rss_mb} MB` : ""),
    el("td", {}, a.last_exit ? String(a.last_exit) : ""),
    el("td", {}, ...(a.remote ? [] : [agentButton(a.name, "restart"), agentButton(a.name, "stop"), agentButton(a.name, "start")]))));
  $("agents").tBodies[0].replaceChildren(...rows);
}

function drawHeader(picture) {
  const sup = picture.supervisor;
  $("supervisor").textContent = sup.running ? `supervisor pid ${sup.pid} on ${sup.host}` : "supervisor not running";
  const t = picture.usage.total;
  $("usage").textContent = `${t.calls} LLM calls · ${t.tokens_in} in / ${t.tokens_out} out tokens · ${dollars(t.cost_usd)}`;
}

// Spend against each cap, as `usage` prints it; a bar shows how much of the cap is gone.
function drawBudgets(rows) {
  const lines = rows.map((b) => {
    const share = b.limit > 0 ? Math.min(1, b.spent / b.limit) : 1;
    const bar = el("span", { class: "bar" }, el("span", { class: "fill" }));
    bar.firstChild.style.width = `${Math.round(share * 100)}%`;
    return el("tr", { "data-scope": String(b.scope), "data-cap": String(b.cap), "data-level": share >= 1 ? "reached" : share >= 0.8 ? "near" : "ok" },
      el("td", {}, String(b.scope)), el("td", {}, String(b.cap)), el("td", { class: "spent" }, dollars(b.spent)),
      el("td", { class: "limit" }, dollars(b.limit)), el("td", {}, dollars(b.left)), el("td", {}, bar));
  });
  $("budgets").tBodies[0].replaceChildren(...lines);
  $("budgets-none").hidden = rows.length > 0;
}

// Each agent's breakers as doctor shows them (its words: closed, open until ..., half-open).
function drawBreakers(rows) {
  const lines = rows.map((b) => el("tr", { "data-agent": String(b.agent), "data-provider": String(b.provider), "data-level": String(b.level) },
    el("td", {}, String(b.agent)), el("td", {}, String(b.provider)), el("td", { class: "state" }, String(b.state))));
  $("breakers").tBodies[0].replaceChildren(...lines);
  $("breakers-none").hidden = rows.length > 0;
}

function draw(picture) {
  state.picture = picture;
  if (typeof picture.at === "number") state.skew = picture.at - Date.now() / 1000;
  drawHeader(picture);
  drawBoard(picture.board, picture.usage);
  drawAgents(picture.agents);
  drawEvents(picture.recent || []);
  drawBudgets(picture.budgets || []);
  drawBreakers(picture.breakers || []);
}

function tickAges() {
  for (const node of document.querySelectorAll(".age[data-at]")) node.textContent = age(node.dataset.at);
  for (const node of document.querySelectorAll(".lease[data-until]")) node.textContent = leaseLeft(node.dataset.until);
}

// -- the event stream --------------------------------------------------------------------------

// The server renders each event as `hermes-sup events` prints it: a transition, a supervisor's or an
// alert's event, each in its own words.
function eventLine(e) {
  return typeof e.line === "string" ? e.line : "";
}

// The newest events, newest first: the picture's own list (so a fresh page has them too).
function drawEvents(recent) {
  $("events").replaceChildren(...recent.slice().reverse().map((e) => el("li", {}, eventLine(e))));
}

function connect() {
  // EventSource resends the last `id:` it saw as Last-Event-ID when it reconnects: nothing is lost.
  const source = new EventSource("/api/events");
  source.addEventListener("open", () => { $("live").textContent = "live"; $("live").dataset.state = "live"; });
  source.addEventListener("error", () => {
    $("live").textContent = "reconnecting"; $("live").dataset.state = "reconnecting";
  });
  source.addEventListener("snapshot", (m) => {
    draw(JSON.parse(m.data));
  });
  // Each event is followed by the picture it led to; an event itself only matters to an open drawer.
  source.addEventListener("event", (m) => {
    if (state.open && JSON.parse(m.data).task === state.open) openTask(state.open, true);
  });
  source.addEventListener("reset", (m) => say(JSON.parse(m.data).reason, "info"));
}

// -- the drawer --------------------------------------------------------------------------------

async function openTask(id, quiet) {
  let response;
  try {
    response = await fetch(`/api/task/${encodeURIComponent(id)}`, { credentials: "same-origin" });
  } catch (err) {
    if (!quiet) say(`could not read ${id}: ${err}`, "error");
    return;
  }
  const doc = await response.json().catch(() => ({ error: "not JSON" }));
  if (!response.ok) { if (!quiet) say(doc.error || `HTTP ${response.status}`, "error"); return; }
  state.open = doc.id;
  $("drawer").hidden = false;
  $("d-title").textContent = String(doc.title);
  $("d-id").textContent = doc.id;
  $("d-status").textContent = doc.status;
  const fields = [["body", doc.body], ["why not moving", doc.waiting], ["role", doc.role], ["assignee", doc.assignee],
    ["holder", doc.claim && doc.claim.agent ? `${doc.claim.agent}${doc.claim.host ? " on " + doc.claim.host : ""}` : ""],
    ["attempts", `${doc.attempts ?? 0} of ${doc.max_attempts ?? "?"}`], ["depends on", (doc.depends_on || []).join(", ")],
    ["error", doc.error], ["result", doc.result == null ? "" : typeof doc.result === "string" ? doc.result : JSON.stringify(doc.result, null, 2)],
    ["cost", doc.cost ? `${dollars(doc.cost.cost_usd)} (${doc.cost.calls} calls)` : ""],
    ["models", (doc.models || []).map((m) => `${m.provider} (${m.model})`).join(", ")],
    ["files", (doc.files || []).map((f) => `${f.agent}: ${f.path}`).join("\n")],
    ["branches", Object.entries(doc.worktrees || {}).map(([name, t]) => t.error ? `${name}: ${t.branch}: ${t.error}`
      : [`${name}: ${t.branch} from ${t.base}: ${(t.commits || []).length} commit(s), ${t.diffstat || "no change"}`,
        ...(t.commits || []).map((c) => `  ${c}`)].join("\n")).join("\n")],
    ["created", doc.created_at], ["updated", doc.updated_at]];
  $("d-fields").replaceChildren(...fields.filter(([, v]) => v).flatMap(([k, v]) => [el("dt", {}, k), el("dd", {}, String(v))]));
  $("d-question-box").hidden = !doc.question;
  $("d-question").textContent = doc.question || "";
  $("d-comments").replaceChildren(...(doc.comments || []).map((c) =>
    el("li", {}, `${c.by || "?"} ${(c.at || "").slice(0, 19)}: ${c.text}`)));
  $("d-history").replaceChildren(...(doc.history || []).map((h) =>
    el("li", {}, `${(h.at || "").slice(0, 19)} ${h.from || "-"} → ${h.to || "-"} by ${h.by || "-"}${h.note ? " " + h.note : ""}`)));
  if (!state.log || state.log.id !== doc.id) followLog(doc.id);
}

// The drawer's log streams as the agents write it (the server follows their journals as `task log
// -f` does); one stream, for the open task only.
function followLog(id) {
  if (state.log) state.log.source.close();
  $("d-log").replaceChildren();
  const source = new EventSource(`/api/task/${encodeURIComponent(id)}/log`);
  state.log = { id, source };
  source.addEventListener("entry", (m) => {
    const box = $("d-log");
    const atEnd = box.scrollTop + box.clientHeight >= box.scrollHeight - 4;
    for (const line of JSON.parse(m.data).lines) box.append(el("div", { class: "line" }, line));
    while (box.childElementCount > 5000) box.firstChild.remove();
    if (atEnd) box.scrollTop = box.scrollHeight;
  });
  source.addEventListener("note", (m) => $("d-log").append(el("div", { class: "note" }, `note: ${JSON.parse(m.data).text}`)));
}

function closeDrawer() {
  state.open = null;
  if (state.log) { state.log.source.close(); state.log = null; }
  $("drawer").hidden = true;
}

// -- actions -----------------------------------------------------------------------------------

async function act(url, body, what) {
  let response;
  try {
    response = await fetch(url, { method: "POST", credentials: "same-origin",
      headers: { "Content-Type": "application/json" }, body: JSON.stringify(body) });
  } catch (err) {
    say(`${what}: ${err}`, "error");
    return null;
  }
  const reply = await response.json().catch(() => ({}));
  if (!response.ok) { say(`${what}: ${reply.error || "HTTP " + response.status}`, "error"); return null; }
  say(`${what}: ${reply.message || "done"}`, "info");
  return reply;
}

function wire() {
  $("add-form").addEventListener("submit", async (e) => {
    e.preventDefault();
    const body = { title: $("add-title").value, body: $("add-body").value };
    if ($("add-role").value) body.role = $("add-role").value;
    const doc = await act("/api/task", body, "add task");
    if (doc) { $("add-title").value = ""; $("add-body").value = ""; say(`added ${doc.id}`, "info"); }
  });
  $("drawer-close").addEventListener("click", closeDrawer);
  document.addEventListener("keydown", (e) => { if (e.key === "Escape") closeDrawer(); });
  for (const button of $("d-actions").querySelectorAll("button")) {
    button.addEventListener("click", async () => {
      const id = state.open;
      const command = button.dataset.command;
      if (id && await act(`/api/task/${encodeURIComponent(id)}/${command}`, {}, `${command} ${id}`)) openTask(id, true);
    });
  }
  for (const [form, input, command] of [["comment-form", "comment-text", "comment"], ["answer-form", "answer-text", "answer"]]) {
    $(form).addEventListener("submit", async (e) => {
      e.preventDefault();
      const id = state.open;
      if (id && await act(`/api/task/${encodeURIComponent(id)}/${command}`, { text: $(input).value }, `${command} ${id}`)) {
        $(input).value = "";
        openTask(id, true);
      }
    });
  }
}

wire();
connect();
setInterval(tickAges, 1000);  // the clock only: ages are computed here, nothing is fetched
