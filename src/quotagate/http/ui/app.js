// quotagate dashboard: plain JavaScript, no build step, no third-party code.
// It polls GET /v1/dashboard once a second and updates the page in place:
// rows are matched by key and a cell is rewritten only when its content changed.
"use strict";

const TOKEN_KEY = "quotagate.token";   // sessionStorage: this tab only, gone when it closes
const POLL_MS = 1000;
const TIMEOUT_MS = 5000;

const state = { snapshot: null, story: null, timer: null, route: null, generation: 0 };

// -- small DOM helpers -----------------------------------------------------------

const $ = (id) => document.getElementById(id);

function el(tag, attributes, ...children) {
  const node = document.createElement(tag);
  for (const [name, value] of Object.entries(attributes || {})) {
    if (value === null || value === undefined || value === false) continue;
    if (name === "class") node.className = value;
    else node.setAttribute(name, value);
  }
  for (const child of children) {
    if (child === null || child === undefined) continue;
    node.append(child instanceof Node ? child : String(child));
  }
  return node;
}

function seconds(value) {
  if (value === null || value === undefined) return "–";
  const s = Math.max(0, Math.round(value));
  if (s < 60) return `${s}s`;
  if (s < 3600) return `${Math.floor(s / 60)}m ${String(s % 60).padStart(2, "0")}s`;
  return `${Math.floor(s / 3600)}h ${String(Math.floor((s % 3600) / 60)).padStart(2, "0")}m`;
}

function clock(epoch) {
  if (!epoch) return "–";
  return new Date(epoch * 1000).toLocaleTimeString([], { hour12: false });
}

function costText(cost) {
  return Object.entries(cost || {}).map(([name, amount]) => `${name}=${amount}`).join(" ");
}

function number(value) {
  return Number.isInteger(value) ? String(value) : Number(value).toFixed(1);
}

function requestHref(tenant, id) {
  return `#/requests/${encodeURIComponent(tenant)}/${encodeURIComponent(id)}`;
}

// A cell is a string or {text, href, cls, badge, bar: {used, cap}, title}.
function buildCell(spec) {
  if (spec === null || spec === undefined) return ["", null];
  if (typeof spec !== "object") return [String(spec), null];
  if (spec.bar) {
    const { used, cap, borrowing } = spec.bar;
    const share = cap > 0 ? Math.min(1, used / cap) : (used > 0 ? 1 : 0);
    // A cohort member above its nominal share is borrowing, not over a cap.
    const level = borrowing ? "bar borrowing" : share >= 1 ? "bar full" : share >= 0.8 ? "bar high" : "bar";
    const fill = el("span");
    fill.style.width = `${(share * 100).toFixed(1)}%`;
    const bar = el("div", { class: level, role: "meter", "aria-valuemin": "0",
      "aria-valuemax": String(cap), "aria-valuenow": String(used),
      "aria-label": `${number(used)} of ${number(cap)}${borrowing ? ", borrowing above it" : ""}` }, fill);
    return [el("div", { class: "usage" }, bar,
      el("span", { class: "amount" }, `${number(used)} / ${number(cap)}`)), null];
  }
  if (spec.badge) return [el("span", { class: `badge ${spec.badge}` }, spec.text ?? spec.badge), spec.cls];
  if (spec.href) return [el("a", { href: spec.href }, spec.text), spec.cls];
  return [spec.text ?? "", spec.cls];
}

// Bring tbody's rows to `rows` ([{key, cells}]) touching only what changed, so
// nothing flickers and a focused link keeps its focus while its row is unchanged.
function renderRows(tbody, rows, emptyText, columns) {
  if (rows.length === 0) rows = [{ key: "__empty", empty: true, cells: [emptyText] }];
  const existing = new Map();
  for (const row of tbody.rows) existing.set(row.dataset.key, row);
  const head = tbody.parentElement.tHead;
  const headers = head ? Array.from(head.rows[0].cells, (cell) => cell.textContent.trim()) : [];
  let previous = null;
  for (const row of rows) {
    let tr = existing.get(row.key);
    if (tr) existing.delete(row.key);
    else {
      tr = el("tr");
      tr.dataset.key = row.key;
      if (row.empty) tr.className = "empty";
    }
    row.cells.forEach((spec, index) => {
      let td = tr.cells[index];
      if (!td) {
        td = el("td");
        if (row.empty) td.colSpan = columns;
        // On a phone each row becomes a card and each cell shows its column's name.
        else if (headers[index]) td.dataset.label = headers[index];
        tr.append(td);
      }
      const signature = JSON.stringify(spec ?? null);
      if (td.dataset.sig === signature) return;
      td.dataset.sig = signature;
      const [content, cls] = buildCell(spec);
      td.className = cls || "";
      td.replaceChildren(content);
    });
    const wanted = previous ? previous.nextSibling : tbody.firstChild;
    if (wanted !== tr) tbody.insertBefore(tr, wanted);
    previous = tr;
  }
  for (const stale of existing.values()) stale.remove();
}

function renderFacts(dl, facts) {
  const signature = JSON.stringify(facts);
  if (dl.dataset.sig === signature) return;
  dl.dataset.sig = signature;
  dl.replaceChildren(...facts.flatMap(([term, value]) => {
    const [content] = buildCell(value);
    return [el("dt", null, term), el("dd", null, content)];
  }));
}

// -- talking to the API ----------------------------------------------------------

class ApiError extends Error {
  constructor(status, code, message) {
    super(message);
    this.status = status;
    this.code = code;
  }
}

async function api(path) {
  const token = sessionStorage.getItem(TOKEN_KEY);
  const abort = new AbortController();
  const timer = setTimeout(() => abort.abort(), TIMEOUT_MS);
  let response;
  try {
    response = await fetch(path, {
      headers: { Authorization: `Bearer ${token}`, Accept: "application/json" },
      cache: "no-store", credentials: "omit", signal: abort.signal,
    });
  } catch (error) {
    throw new ApiError(0, "unreachable", "the server did not answer; retrying");
  } finally {
    clearTimeout(timer);
  }
  let body = null;
  try { body = await response.json(); } catch (error) { body = null; }
  if (!response.ok) {
    const message = body && body.message ? body.message : `HTTP ${response.status}`;
    throw new ApiError(response.status, body && body.code ? body.code : "http_error", message);
  }
  return body;
}

// -- views ----------------------------------------------------------------------

function usageRows(rows) {
  return rows.map((row) => ({
    key: `${row.name}/${row.resource}`,
    cells: [row.name, row.resource, { bar: { used: row.used, cap: row.cap } }],
  }));
}

function amount(value) {
  return { text: value === null || value === undefined ? "–" : number(value), cls: "num" };
}

// Resource-hours left of a budget (issue 12), with its limit when the server names it.
function budgetText(row) {
  if (row.budget_left_hours === undefined || row.budget_left_hours === null) return "–";
  const left = `${number(row.budget_left_hours)} h`;
  return row.budget_limit ? `${left} of ${row.budget_limit}` : left;
}

// A tenant row: used against its cap, which in a cohort is its nominal share, then
// what it borrows and lends. A budget is shown only when the server reports one.
function tenantRows(rows) {
  return rows.map((row) => ({
    key: `${row.name}/${row.resource}`,
    cells: [
      row.name, row.resource,
      { bar: { used: row.used, cap: row.cap, borrowing: row.cohort && row.used > row.cap } },
      { text: row.cohort || "–", cls: "sharing" },
      { ...amount(row.cohort ? row.borrowed : null), cls: "num sharing" },
      { ...amount(row.cohort ? row.lent : null), cls: "num sharing" },
      { text: budgetText(row), cls: "num budget" },
    ],
  }));
}

function renderOverview(data) {
  const admitted = data.history.reduce((sum, minute) => sum + minute.admitted, 0);
  const rejected = data.history.reduce((sum, minute) => sum + minute.rejected, 0);
  $("tile-waiting").textContent = data.waiting;
  $("tile-backlog").textContent = data.backlog;
  $("tile-stops").textContent = data.stops.length;
  $("tile-admitted").textContent = admitted;
  $("tile-rejected").textContent = rejected;
  const tenants = $("tenants");
  // The fair-sharing columns appear once some tenant is in a cohort.
  tenants.classList.toggle("plain", !data.tenants.some((row) => row.cohort));
  tenants.classList.toggle("budgets", data.tenants.some((row) => row.budget_left_hours !== undefined && row.budget_left_hours !== null));
  const plain = tenants.classList.contains("plain");
  tenants.rows[0].cells[2].textContent = plain ? "Used / cap" : "Used / nominal";
  $("tenants-sub").textContent = plain ? "" : "in a cohort the cap is a nominal share; a purple bar is borrowing above it";
  renderRows(tenants.tBodies[0], tenantRows(data.tenants), "No tenant has a quota yet.", 7);
  renderRows($("pools").tBodies[0], usageRows(data.pools), "No pool yet.", 3);
  const cohorts = data.cohorts || [];
  $("cohorts-card").hidden = cohorts.length === 0;
  renderRows($("cohorts").tBodies[0], usageRows(cohorts), "No cohort yet.", 3);
  renderChart(data.history);
}

function svg(tag, attributes) {
  const node = document.createElementNS("http://www.w3.org/2000/svg", tag);
  for (const [name, value] of Object.entries(attributes)) node.setAttribute(name, value);
  return node;
}

function renderChart(history) {
  const box = $("chart");
  // Drawn at the box's own width, so text is never stretched; redrawn when that changes.
  const width = Math.max(280, Math.round(box.clientWidth || 720));
  const signature = JSON.stringify([width, history.map((m) => [m.minute, m.admitted, m.rejected, m.queue_depth])]);
  if (box.dataset.sig === signature) return;
  box.dataset.sig = signature;
  const height = 170, left = 34, bottom = 20, top = 8;
  const plotHeight = height - bottom - top;
  const slot = (width - left) / Math.max(1, history.length);
  const barMax = Math.max(1, ...history.map((m) => m.admitted + m.rejected));
  const depthMax = Math.max(1, ...history.map((m) => m.queue_depth));
  const chart = svg("svg", { viewBox: `0 0 ${width} ${height}` });
  chart.append(svg("line", { class: "axis", x1: left, y1: height - bottom, x2: width, y2: height - bottom }));
  const label = (x, y, text, anchor) => {
    const node = svg("text", { x, y, "text-anchor": anchor || "start" });
    node.textContent = text;
    chart.append(node);
  };
  label(left - 4, top + 10, String(barMax), "end");
  label(left - 4, height - bottom, "0", "end");
  label(left, height - 4, "−60 min");
  label(width, height - 4, "now", "end");
  history.forEach((minute, index) => {
    const x = left + index * slot + slot * 0.15;
    const w = slot * 0.7;
    const admittedHeight = (minute.admitted / barMax) * plotHeight;
    const rejectedHeight = (minute.rejected / barMax) * plotHeight;
    const base = height - bottom;
    if (admittedHeight > 0) chart.append(svg("rect", { class: "admitted", x, width: w, y: base - admittedHeight, height: admittedHeight }));
    if (rejectedHeight > 0) chart.append(svg("rect", { class: "rejected", x, width: w, y: base - admittedHeight - rejectedHeight, height: rejectedHeight }));
  });
  const points = history.map((minute, index) => {
    const x = left + index * slot + slot / 2;
    const y = height - bottom - (minute.queue_depth / depthMax) * plotHeight;
    return `${x.toFixed(1)},${y.toFixed(1)}`;
  });
  chart.append(svg("polyline", { class: "depth", points: points.join(" ") }));
  box.setAttribute("aria-label", `last hour: ${history.reduce((s, m) => s + m.admitted, 0)} admitted, `
    + `${history.reduce((s, m) => s + m.rejected, 0)} rejected, queue depth now ${history.length ? history[history.length - 1].queue_depth : 0}`);
  box.replaceChildren(chart);
}

function renderQueue(data) {
  $("queue-sub").textContent = data.waiting > data.queue.length
    ? `(first ${data.queue.length} of ${data.waiting})` : `(${data.waiting})`;
  // Room a preemption freed, held for its waiting preemptor (docs/decisions/721).
  const holds = data.holds || [];
  const held = $("queue-holds");
  held.hidden = holds.length === 0;
  held.replaceChildren(...(holds.length ? [document.createTextNode("Room held for ")] : []),
    ...holds.flatMap((hold, index) => {
      const link = document.createElement("a");
      link.href = requestHref(hold.tenant, hold.id);
      link.className = "mono";
      link.textContent = hold.id;
      return [...(index ? [document.createTextNode(", ")] : []), link,
        document.createTextNode(` (${hold.tenant}, ${costText(hold.cost)})`)];
    }));
  renderRows($("queue").tBodies[0], data.queue.map((entry) => ({
    key: entry.id,
    cells: [
      { text: String(entry.position), cls: "num" },
      { text: entry.id, href: requestHref(entry.tenant, entry.id), cls: "mono" },
      entry.tenant,
      costText(entry.cost),
      { text: String(entry.priority), cls: "num" },
      { text: entry.effective_priority.toFixed(1), cls: "num" },
      { text: seconds(entry.waited_seconds), cls: "num" },
      { text: entry.reason, cls: "reason" },
    ],
  })), "Nothing is waiting.", 8);
}

// Audit operations whose target is a request: its steps, and the state a release ends it in.
// A requeue writes "requeue" and its release "waiting"; a preemption "hold" for its preemptor.
const REQUEST_OPERATIONS = ["submit", "admit", "expire", "deliver", "delivered", "cancel", "complete", "fail",
  "cancelling", "cancelled", "preempt", "preempted", "completed", "failed", "requeue", "waiting",
  "hold", "timeout", "timed_out"];

function targetCell(entry) {
  if (!entry.target) return "";
  // Entries about one request name it as their target; others name a tenant, a pool, a bucket.
  const looksLikeRequest = entry.tenant && !entry.target.includes("/") && entry.operation !== "tenant.set";
  return looksLikeRequest && REQUEST_OPERATIONS.includes(entry.operation)
    ? { text: entry.target, href: requestHref(entry.tenant, entry.target), cls: "mono" }
    : { text: entry.target, cls: "mono" };
}

function renderDecisions(data) {
  renderRows($("decisions").tBodies[0], data.decisions.map((entry) => ({
    key: String(entry.id),
    cells: [
      clock(entry.at), { text: entry.tenant || "–", cls: "nowrap" }, entry.operation,
      { badge: entry.outcome, text: entry.outcome },
      targetCell(entry), { text: entry.reason || "", cls: "reason" }, { text: entry.actor, cls: "mono" },
    ],
  })), "No decisions recorded yet.", 7);
}

// A target's own words are for operators; a tenant's token gets only that it failed.
function lastError(entry) {
  if (entry.last_error) return entry.last_error;
  return entry.failing ? "the last attempt failed (the target's answer is shown to admins)" : "";
}

// A stop under way ("SIGTERM sent, waiting for the exit") is no failure: its answer is
// `progress`; `last_error`/`failing` only when asking the target failed (decision 823).
// A tenant's token gets neither text, only whether the last ask failed.
function stopAnswer(entry) {
  if (entry.last_error) return entry.last_error;
  if (entry.failing) return "the last stop attempt failed (the target's answer is shown to admins)";
  if (entry.progress) return entry.progress;
  return "not confirmed yet";
}

function renderDelivery(data) {
  $("delivery-sub").textContent = `(${data.backlog} undelivered)`;
  renderRows($("deliveries").tBodies[0], data.deliveries.map((entry) => ({
    key: entry.request_id,
    cells: [
      { text: entry.request_id, href: requestHref(entry.tenant, entry.request_id), cls: "mono" },
      entry.tenant, { badge: entry.state, text: entry.state }, entry.target || "default",
      { text: String(entry.attempts), cls: "num" }, { text: seconds(entry.age_seconds), cls: "num" },
      { text: entry.next_attempt_in > 0 ? `in ${seconds(entry.next_attempt_in)}` : "now", cls: "num" },
      { text: entry.claimed_by || "–", cls: "mono" }, { text: String(entry.fencing_token), cls: "num" },
      { text: lastError(entry), cls: "reason" },
    ],
  })), "Every admitted request has been delivered.", 10);
  renderRows($("stops").tBodies[0], data.stops.map((entry) => ({
    key: entry.id,
    cells: [
      { text: entry.id, href: requestHref(entry.tenant, entry.id), cls: "mono" }, entry.tenant,
      { badge: entry.state, text: entry.state }, entry.pool || "–", costText(entry.cost),
      { text: seconds(entry.since_seconds), cls: "num" }, { text: entry.reason || "", cls: "reason" },
      { text: String(entry.attempts ?? 0), cls: "num" }, { text: stopAnswer(entry), cls: "reason" },
    ],
  })), "No stop is waiting for its executor.", 9);
}

function renderRates(data) {
  renderRows($("buckets").tBodies[0], data.buckets.map((entry) => ({
    key: entry.key,
    cells: [
      { text: entry.key, cls: "mono" }, entry.tenant, entry.topic || "–",
      { bar: { used: Math.floor(entry.tokens), cap: entry.capacity } },
      { text: String(entry.refill_per_second), cls: "num" },
    ],
  })), "No tenant has a rate quota.", 5);
}

function count(value) {
  return { text: value === null || value === undefined ? "–" : String(value), cls: "num" };
}

function renderStreams(data) {
  // Absent from a server older than the Streams view: show it empty rather than fail.
  const streams = data.streams || { topics: [], total: 0, error: null };
  $("streams-sub").textContent = streams.total > streams.topics.length
    ? `(first ${streams.topics.length} of ${streams.total})` : `(${streams.total})`;
  const problem = $("streams-error");
  const message = streams.error ? `Stream numbers unavailable: ${streams.error.message}` : "";
  if (problem.textContent !== message) problem.textContent = message;
  problem.hidden = !message;
  renderRows($("topics").tBodies[0], streams.topics.map((topic) => ({
    key: `${topic.tenant}/${topic.topic}`,
    cells: [
      topic.tenant, { text: topic.topic, cls: "mono" }, count(topic.partitions),
      count(topic.parallelism), count(topic.max_len), count(topic.length),
      count(topic.pending), count(topic.lag), count(topic.dlq),
    ],
  })), "No stream topic yet.", 9);
  const groups = streams.topics.flatMap((topic) => topic.groups.map((group) => ({
    key: `${topic.tenant}/${topic.topic}/${group.group}`,
    cells: [
      topic.tenant, { text: topic.topic, cls: "mono" }, { text: group.group, cls: "mono" },
      count(group.pending), count(group.lag),
      { text: group.partitions.map((p) => `${p.partition}: ${p.owner || "–"} (${p.generation})`).join(", "), cls: "mono" },
    ],
  })));
  renderRows($("stream-groups").tBodies[0], groups, "No consumer group yet.", 6);
}

// Why a request has no outbox row: never admitted; ended before delivery (the row
// goes with the release); or stopped after it (the row goes with the confirmed stop).
function outboxGone(request, story) {
  if (["waiting", "rejected", "expired"].includes(request.state)) return "none: the request was never admitted";
  const delivered = story.history.find((entry) => entry.operation === "deliver" && entry.outcome === "delivered");
  if (delivered) return `delivered at ${clock(delivered.at)}; its outbox row went when its stop was confirmed`;
  return "none: it ended before it was delivered";
}

function renderStory(story) {
  const request = story.request;
  $("request-title").textContent = `Request ${request.id}`;
  renderFacts($("request-facts"), [
    ["State", { badge: request.state, text: request.state }],
    ["Tenant", request.tenant],
    ["Cost", costText(request.cost)],
    ["Priority", String(request.priority)],
    ["Pool", request.pool || "–"],
    ["Target", request.target || "default"],
    ["Submitted", clock(request.created)],
    ["Last change", clock(request.updated)],
    ["Reason", request.reason || "–"],
  ]);
  const queue = story.queue;
  $("request-queue-card").hidden = !queue;
  if (queue) {
    renderFacts($("request-queue"), [
      ["Why", queue.reason],
      ["Position", `${queue.position} overall, ${queue.tenant_position} in its tenant`],
      ["Effective priority", queue.effective_priority.toFixed(2)],
      ["Waiting for", seconds(queue.waited_seconds)],
      ["Pools with room", queue.fitting_pools.join(", ") || "none"],
    ]);
  }
  const binding = story.binding;
  renderFacts($("request-binding"), binding ? [
    ["Object", { text: binding.external_name, cls: "mono" }],
    ["UID", { text: binding.uid || "–", cls: "mono" }],
    ["Target", binding.target],
    ["Fencing token", String(binding.fencing_token)],
    ["Bound at", clock(binding.created)],
  ] : [["Object", "not bound to an external object yet"]]);
  const delivery = story.delivery;
  renderFacts($("request-delivery"), delivery ? [
    ["Delivered", delivery.delivered ? `yes, at ${clock(delivery.delivered_at)}` : "not yet"],
    ["Attempts", String(delivery.attempts)],
    ["Fencing token", String(delivery.fencing_token)],
    ["Claimed by", { text: delivery.claimed_by || "–", cls: "mono" }],
    ["Last error", lastError(delivery) || "–"],
    ...(delivery.stop_progress ? [["Stop progress", delivery.stop_progress]] : []),
  ] : [["Outbox", outboxGone(request, story)]]);
  renderRows($("story").tBodies[0], story.history.map((entry) => ({
    key: String(entry.id),
    cells: [clock(entry.at), entry.operation, { badge: entry.outcome, text: entry.outcome },
      { text: entry.reason || "", cls: "reason" }, { text: entry.actor, cls: "mono" }],
  })), "No audit entries.", 5);
}

// -- routing, polling, sign-in ---------------------------------------------------

const VIEWS = ["overview", "queue", "decisions", "delivery", "rates", "streams", "request"];

function currentRoute() {
  const parts = location.hash.replace(/^#\/?/, "").split("/").map(decodeURIComponent);
  if (parts[0] === "requests" && parts.length === 3) return { view: "request", tenant: parts[1], id: parts[2] };
  return { view: VIEWS.includes(parts[0]) && parts[0] !== "request" ? parts[0] : "overview" };
}

function showView(route) {
  for (const view of VIEWS) $(`view-${view}`).hidden = view !== route.view;
  for (const link of document.querySelectorAll("nav a")) {
    if (link.dataset.view === route.view) link.setAttribute("aria-current", "page");
    else link.removeAttribute("aria-current");
  }
}

function render() {
  const data = state.snapshot;
  if (!data) return;
  $("scope").textContent = data.admin ? "admin · all tenants" : `tenant ${data.tenant}`;
  $("nav-queue").textContent = data.waiting || "";
  $("nav-delivery").textContent = (data.backlog + data.stops.length) || "";
  renderOverview(data);
  renderQueue(data);
  renderDecisions(data);
  renderDelivery(data);
  renderRates(data);
  renderStreams(data);
  if (state.route.view === "request" && state.story) renderStory(state.story);
}

function showError(message) {
  const banner = $("error");
  banner.textContent = message || "";
  banner.hidden = !message;
}

async function poll() {
  clearTimeout(state.timer);
  // A navigation starts a new poll at once; a poll still in flight then neither
  // renders nor schedules another, so there is only ever one polling loop.
  const generation = ++state.generation;
  const route = state.route;
  try {
    const snapshot = await api("/v1/dashboard");
    let story = null;
    if (route.view === "request") {
      story = await api(`/v1/dashboard/requests/${encodeURIComponent(route.tenant)}/${encodeURIComponent(route.id)}`);
    }
    if (generation !== state.generation) return;
    state.snapshot = snapshot;
    state.story = story;
    showError("");
    showView(route);
    render();
    $("live").textContent = `updated ${clock(snapshot.at)}`;
    $("live").classList.remove("stale");
  } catch (error) {
    if (generation !== state.generation) return;
    if (error.status === 401) {
      signOut(error.message);
      return;
    }
    $("live").textContent = "not updating";
    $("live").classList.add("stale");
    if (route.view === "request" && error.status === 404) {
      showView(route);
      $("view-request").hidden = true;
    }
    showError(error.message);
  }
  state.timer = setTimeout(poll, POLL_MS);
}

function signedIn() {
  $("sign-in").hidden = true;
  $("nav").hidden = false;
  $("session").hidden = false;
  state.route = currentRoute();
  poll();
}

function signOut(message) {
  clearTimeout(state.timer);
  state.generation += 1;  // a poll in flight is forgotten
  sessionStorage.removeItem(TOKEN_KEY);
  state.snapshot = null;
  state.story = null;
  for (const view of VIEWS) $(`view-${view}`).hidden = true;
  showError("");
  $("nav").hidden = true;
  $("session").hidden = true;
  $("sign-in").hidden = false;
  $("sign-in-error").textContent = message || "";
  $("token").value = "";
  $("token").focus();
}

document.addEventListener("DOMContentLoaded", () => {
  $("sign-in-form").addEventListener("submit", (event) => {
    event.preventDefault();
    const token = $("token").value.trim();
    if (!token) return;
    sessionStorage.setItem(TOKEN_KEY, token);
    $("token").value = "";
    $("sign-in-error").textContent = "";
    signedIn();
  });
  $("sign-out").addEventListener("click", () => signOut(""));
  window.addEventListener("resize", () => { if (state.snapshot) renderChart(state.snapshot.history); });
  window.addEventListener("hashchange", () => {
    if (!sessionStorage.getItem(TOKEN_KEY)) return;
    state.route = currentRoute();
    state.story = null;
    showView(state.route);
    if (state.route.view !== "request") render();
    poll();
  });
  if (sessionStorage.getItem(TOKEN_KEY)) signedIn();
  else signOut("");
});
