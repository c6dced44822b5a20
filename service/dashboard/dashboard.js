// The MV backfill dashboard: vanilla JS over the public HTTP API, no build step.
//   #/            the job list (progress of running jobs polled every second)
//   #/jobs/{id}   one job: progress, per-vnode heatmap, rows/s sparkline, controls
// GET /v1/events (Server-Sent Events) triggers refreshes as jobs change.
// Every request carries a bearer token: opened as /dashboard#token=..., the page keeps it
// in localStorage (and drops it from the address); a 401 asks for one.
"use strict";

const POLL_MS = 1000;
const RATE_WINDOW_MS = 3000; // rows/s is measured over at least this much time
const SPARK_POINTS = 60;
const MAX_EVENTS = 500;
const RECENT_EVENTS = 100; // the first load shows these, not every event since id 0
const EVENT_KINDS = [
  "job_created", "paused", "resumed", "throttled", "rescaled", "phase_changed",
  "recovered", "created", "cancelled", "dropped", "failed", "retried", "rows_skipped",
];
// each kind's vnode states, as the heatmap draws them: not started, under way, done
const VNODE_LOOK = {
  not_started: "not_started", in_progress: "in_progress", completed: "completed",
  consuming: "in_progress", consumed: "completed",
};

const $ = (id) => document.getElementById(id);

const state = {
  route: { name: "list" },
  filter: "",
  pages: [null], // `after` cursors of the pages seen so far; the last is the current page
  next: null,
  progress: new Map(), // job id -> last progress (for jobs whose numbers no longer move)
  samples: [], // [{t, rows}] of the open job, oldest first
  rates: [], // rows/s history of the open job
  events: [], // recent events of every job, oldest first
  rateEdited: false, // the rate-limit input holds the user's edit: polls leave it alone
  busy: false,
  again: false,
};

// ---------------------------------------------------------------- token

const TOKEN_KEY = "backfill.token";
let memoryToken = null; // when localStorage is unavailable
let tokenWaiters = []; // resolved when the user gives a new token

function getToken() {
  try {
    return localStorage.getItem(TOKEN_KEY) || memoryToken;
  } catch (e) {
    return memoryToken;
  }
}

function setToken(token) {
  memoryToken = token;
  try {
    localStorage.setItem(TOKEN_KEY, token);
  } catch (e) {
    // memoryToken serves this page
  }
  const waiters = tokenWaiters;
  tokenWaiters = [];
  for (const resolve of waiters) resolve();
}

// #token=... in the address: keep it and take it out of the address (and history)
function takeTokenFromUrl() {
  const m = location.hash.match(/^#token=(.+)$/);
  if (!m) return;
  setToken(decodeURIComponent(m[1]));
  history.replaceState(null, "", `${location.pathname}${location.search}#/`);
}

function withToken(headers) {
  const token = getToken();
  return token ? { ...headers, Authorization: `Bearer ${token}` } : headers;
}

function askForToken(message) {
  $("token-message").textContent = message;
  if ($("token-form").hidden) {
    $("token-form").hidden = false;
    $("token-input").focus();
  }
}

const newToken = () => new Promise((resolve) => tokenWaiters.push(resolve));

// ---------------------------------------------------------------- API

class ApiError extends Error {}

// Calls the API (relative to the page, so a path prefix in front of the service works)
// and turns error bodies ({"error": {code, message, details}}) into an ApiError.
async function api(method, path, body) {
  const token = getToken();
  const init = { method, headers: withToken({ Accept: "application/json" }) };
  if (body !== undefined) {
    init.headers["Content-Type"] = "application/json";
    init.body = JSON.stringify(body);
  }
  let response;
  try {
    response = await fetch(path, init);
  } catch (e) {
    throw new ApiError(`cannot reach the control plane (${method} /${path})`);
  }
  const text = await response.text();
  let data = null;
  try {
    data = text ? JSON.parse(text) : null;
  } catch (e) {
    data = null;
  }
  if (response.status === 401) {
    if (token === getToken()) askForToken(token ? "The token was not accepted." : "");
    throw new ApiError("a token is needed");
  }
  if (!response.ok) {
    const err = data && data.error;
    const message = err
      ? `${err.code}: ${err.message}${describeDetails(err.details)}`
      : `HTTP ${response.status} ${response.statusText}`;
    throw new ApiError(`${method} /${path} failed: ${message}`);
  }
  return data;
}

function describeDetails(details) {
  if (!details) return "";
  if (Array.isArray(details)) {
    // validation errors: [{loc: ["body", "rate_limit"], msg, type}]
    const parts = details.map((d) => {
      if (!d || !d.msg) return JSON.stringify(d);
      const where = Array.isArray(d.loc) ? d.loc.filter((p) => p !== "body").join(".") : "";
      return where ? `${where}: ${d.msg}` : d.msg;
    });
    return ` (${parts.join("; ")})`;
  }
  return ` (${JSON.stringify(details)})`;
}

function showError(e) {
  if (e instanceof ApiError && !$("token-form").hidden) return; // the token prompt says it
  $("error-text").textContent = e instanceof Error ? e.message : String(e);
  $("error").hidden = false;
}

function clearError() {
  $("error").hidden = true;
  $("error-text").textContent = "";
}

// ---------------------------------------------------------------- formatting

const fmtInt = (n) => (n === null || n === undefined ? "–" : Math.round(n).toLocaleString("en-US"));

function fmtSeconds(s) {
  if (s === null || s === undefined) return "unknown";
  if (s < 60) return `${s.toFixed(1)} s`;
  const m = Math.floor(s / 60);
  if (m < 60) return `${m} min ${Math.round(s % 60)} s`;
  return `${Math.floor(m / 60)} h ${m % 60} min`;
}

function el(tag, attrs = {}, ...children) {
  const node = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs)) {
    if (k === "class") node.className = v;
    else if (k === "text") node.textContent = v;
    else node.setAttribute(k, v);
  }
  for (const c of children) node.append(c);
  return node;
}

function fillDetails(dl, pairs) {
  dl.replaceChildren();
  for (const [k, v] of pairs) {
    if (v === undefined) continue;
    dl.append(el("dt", { text: k }), el("dd", { text: v === null ? "–" : String(v) }));
  }
}

// The service estimates the total from the planner's statistics; until they exist
// (a table never analyzed) the estimate is just the rows read so far: no real percent.
const estimated = (progress) => progress.total_estimate > progress.rows;

// ---------------------------------------------------------------- routing

function parseRoute() {
  const m = location.hash.match(/^#\/jobs\/(\d+)$/);
  return m ? { name: "job", id: Number(m[1]) } : { name: "list" };
}

function onRoute() {
  takeTokenFromUrl(); // #token=... given while the page is open
  const route = parseRoute();
  const changedJob = route.name !== "job" || state.route.id !== route.id;
  state.route = route;
  if (changedJob) {
    state.samples = [];
    state.rates = [];
    state.rateEdited = false;
    drawSparkline();
  }
  $("list-view").hidden = route.name !== "list";
  $("job-view").hidden = route.name !== "job";
  clearError();
  if (route.name === "job") renderJobEvents();
  refresh();
}

// ---------------------------------------------------------------- refresh loop

// One refresh at a time; a request made while one runs is folded into one more run.
async function refresh() {
  if (state.busy) {
    state.again = true;
    return;
  }
  state.busy = true;
  try {
    do {
      state.again = false;
      if (state.route.name === "job") await refreshJob(state.route.id);
      else await refreshList();
    } while (state.again);
  } catch (e) {
    showError(e);
  } finally {
    state.busy = false;
  }
}

let refreshTimer = null;
function refreshSoon() {
  if (refreshTimer === null) {
    refreshTimer = setTimeout(() => {
      refreshTimer = null;
      refresh();
    }, 150);
  }
}

// ---------------------------------------------------------------- the job list

async function refreshList() {
  const after = state.pages[state.pages.length - 1];
  const query = new URLSearchParams({ limit: "50" });
  if (after !== null) query.set("after", String(after));
  if (state.filter) query.set("state", state.filter);
  const page = await api("GET", `v1/jobs?${query}`);
  state.next = page.next;
  // numbers move while a job is creating; the others are fetched once
  const progress = await Promise.all(
    page.jobs.map((job) => {
      const known = state.progress.get(job.id);
      if (known && job.state !== "creating" && known.state === job.state) return known;
      return api("GET", `v1/jobs/${job.id}/progress`).catch(() => null);
    }),
  );
  page.jobs.forEach((job, i) => {
    if (progress[i]) state.progress.set(job.id, progress[i]);
  });
  if (state.route.name === "list") renderList(page.jobs, progress);
  const workers = await api("GET", "v1/workers").catch(() => null);
  state.workers = workers ? workers.workers : [];
  if (state.route.name === "list" && workers) renderWorkers(state.workers);
}

function renderWorkers(workers) {
  $("workers-body").replaceChildren(
    ...workers.map((w) =>
      el(
        "tr",
        { "data-worker-id": String(w.id) },
        el("td", { text: w.name }),
        el("td", {}, el("span", { class: `badge ${w.state === "alive" ? "created" : "failed"}`, text: w.state })),
        el("td", { class: "num", text: fmtInt(w.actors.length) }),
        el("td", { class: "num", text: fmtInt(w.capacity) }),
        el("td", { text: new Date(w.last_heartbeat_at).toLocaleTimeString() }),
      ),
    ),
  );
  $("workers-empty").hidden = workers.some((w) => w.state === "alive");
}

// where a job's actors run: "worker-a (2), worker-b (1)"
function placement(jobId) {
  const on = (state.workers || [])
    .map((w) => [w.name, w.actors.filter((a) => a.job_id === jobId).length])
    .filter(([, n]) => n > 0);
  return on.length ? on.map(([name, n]) => `${name} (${n})`).join(", ") : undefined;
}

// Rows are kept and updated in place, never rebuilt: a row replaced by the poll between a
// click's press and release would swallow the click.
function renderList(jobs, progress) {
  const body = $("jobs-body");
  const kept = new Map([...body.children].map((tr) => [tr.dataset.jobId, tr]));
  const rows = jobs.map((job, i) => {
    const row = kept.get(String(job.id)) || newJobRow(job);
    updateJobRow(row, job, progress[i]);
    return row;
  });
  const sameOrder = rows.length === body.children.length && rows.every((row, i) => body.children[i] === row);
  if (!sameOrder) body.replaceChildren(...rows);
  $("jobs-empty").hidden = jobs.length > 0;
  $("next-page").hidden = state.next === null;
  $("first-page").hidden = state.pages.length <= 1;
}

function newJobRow(job) {
  return el(
    "tr",
    { "data-job-id": String(job.id) },
    el("td", {}, el("a", { href: `#/jobs/${job.id}`, text: job.name })),
    el("td", { text: job.kind }),
    el("td", {}, el("span", {})),
    el("td", {}),
    el(
      "td",
      {},
      el("div", { class: "cell-progress" }, el("progress", { max: "100", "aria-label": `Progress of ${job.name}` }), el("span", { class: "num" })),
    ),
    el("td", { class: "num" }),
  );
}

// sets a text only when it changed: an unchanged cell is left alone
function setText(node, text) {
  if (node.textContent !== text) node.textContent = text;
}

function updateJobRow(row, job, p) {
  const [, , stateCell, pausedCell, progressCell, rowsCell] = row.children;
  const badge = stateCell.firstChild;
  badge.className = `badge ${job.state}`;
  setText(badge, job.state);
  setText(pausedCell, job.paused ? "yes" : "no");
  const percent = p ? p.percent : job.state === "created" ? 100 : 0;
  const known = !(p && job.state === "creating" && !estimated(p));
  const bar = progressCell.querySelector("progress");
  if (known) bar.value = percent;
  else bar.removeAttribute("value"); // indeterminate
  setText(progressCell.querySelector("span"), known ? `${percent.toFixed(1)}%` : "…");
  setText(rowsCell, p ? fmtInt(p.rows) : "–");
}

// ---------------------------------------------------------------- one job

async function refreshJob(id) {
  const [job, progress, workers] = await Promise.all([
    api("GET", `v1/jobs/${id}`),
    api("GET", `v1/jobs/${id}/progress`),
    api("GET", "v1/workers").catch(() => null),
  ]);
  if (workers) state.workers = workers.workers;
  if (state.route.name !== "job" || state.route.id !== id) return;
  state.progress.set(id, progress);
  sample(progress.rows);
  renderJob(job, progress);
}

function sample(rows) {
  const now = performance.now();
  const samples = state.samples;
  samples.push({ t: now, rows });
  // keep one sample older than the window, so a rate over the whole window exists
  while (samples.length > 2 && now - samples[1].t >= RATE_WINDOW_MS) samples.shift();
  const first = samples[0];
  const dt = (now - first.t) / 1000;
  if (samples.length < 2 || dt <= 0) return;
  state.rates.push(Math.max(0, (rows - first.rows) / dt));
  if (state.rates.length > SPARK_POINTS) state.rates.shift();
  drawSparkline();
}

function drawSparkline() {
  const rates = state.rates;
  const line = $("sparkline-line");
  if (rates.length === 0) {
    line.setAttribute("points", "");
    $("rate-now").textContent = "–";
    return;
  }
  const top = Math.max(...rates, 1);
  const step = 300 / (SPARK_POINTS - 1);
  const offset = SPARK_POINTS - rates.length;
  const points = rates.map((r, i) => `${((offset + i) * step).toFixed(1)},${(58 - (r / top) * 54).toFixed(1)}`);
  line.setAttribute("points", points.join(" "));
  $("rate-now").textContent = fmtInt(rates[rates.length - 1]);
}

function renderJob(job, progress) {
  document.title = `${job.name} · MV backfill`;
  $("job-title").textContent = job.name;
  const badge = $("job-state");
  badge.textContent = progress.phase && job.state === "creating" ? `${job.state} · ${progress.phase}` : job.state;
  badge.className = `badge ${job.state}`;
  $("job-paused").hidden = !job.paused;

  const bar = $("job-progress");
  const total = estimated(progress) || job.state !== "creating";
  if (total) {
    bar.value = progress.percent;
    $("job-percent").textContent = `${progress.percent.toFixed(2)}%`;
  } else {
    bar.removeAttribute("value"); // indeterminate
    $("job-percent").textContent = "estimating…";
  }
  // epochs are decimal strings (docs/api.md#epochs): shown as they come, never through
  // Number(), which rounds them past 2^53 (compare them as BigInt if ever needed).
  // A snapshot job reading its snapshot commits epochs of its own (far below real
  // ones): it shows the epoch it reads at instead.
  const epoch =
    progress.phase === "snapshot" && progress.snapshot_epoch !== null
      ? `reading the snapshot at epoch ${progress.snapshot_epoch}`
      : `committed epoch ${progress.committed_epoch}`;
  $("job-rows").textContent =
    `${fmtInt(progress.rows)} of ${total ? fmtInt(progress.total_estimate) : "an unknown number of"} rows · ${epoch}`;

  const active = job.state === "creating" || job.state === "created";
  $("pause").disabled = !active || job.paused;
  $("resume").disabled = !active || !job.paused;
  $("apply-rate").disabled = !active;
  $("retry").hidden = job.state !== "failed";
  $("job-failure").hidden = job.state !== "failed" || !job.error;
  $("job-failure").textContent = job.state === "failed" && job.error ? `Failed: ${job.error}` : "";
  const input = $("rate-limit");
  if (!state.rateEdited && document.activeElement !== input) showRateLimit(job);

  fillDetails($("job-details"), [
    ["id", job.id],
    ["kind", job.kind],
    ["upstream", job.upstream.table || job.upstream.source || (job.upstream.postgres && `Postgres ${job.upstream.postgres}`)],
    ["view table", job.mv_table],
    ["parallelism", job.parallelism],
    ["rate limit", job.rate_limit === null ? "none" : `${fmtInt(job.rate_limit)} rows/s per actor`],
    ["recoveries", job.recoveries],
    ["recovering", job.recovering ? `yes (${job.recovery_reason || "no reason given"})` : "no"],
    ["actors on", placement(job.id) || (job.waiting_for_worker ? "no live worker: waiting for one" : undefined)],
    ["finished epoch", job.finished_epoch],
    ["created at", new Date(job.created_at).toLocaleString()],
    ["error", job.error === null ? undefined : job.error],
  ]);

  // fields newer services add; shown when present
  const cdc = progress.cdc || null; // a CDC table's job: its chunks, LSN and slot
  fillDetails($("server-rate"), [
    ["CDC phase", cdc ? cdc.phase : undefined],
    ["chunks", cdc ? `${fmtInt(cdc.chunks)} (${fmtInt(cdc.rows)} rows)` : undefined],
    ["exact at LSN", cdc ? cdc.lsn : undefined],
    ["slot confirmed", cdc && cdc.confirmed_lsn ? cdc.confirmed_lsn : undefined],
    ["slot lag", cdc && cdc.slot_lag_bytes !== null ? `${fmtInt(cdc.slot_lag_bytes)} bytes` : undefined],
    ["server rows/s", "rows_per_s" in progress ? fmtInt(progress.rows_per_s) : undefined],
    ["ETA", "eta_s" in progress ? fmtSeconds(progress.eta_s) : undefined],
    [
      "log store lag",
      progress.log_store_lag_ms === null || progress.log_store_lag_ms === undefined
        ? undefined
        : `${fmtInt(progress.log_store_lag_ms)} ms (${fmtInt(progress.log_store_lag_epochs)} epochs)`,
    ],
  ]);

  renderRecoveries(progress.recent_recoveries || []);
  renderHeatmap(progress.vnodes || [], job.kind);
  renderSplits(progress.splits || []);
}

// A source job's partitions: one row each (a source has no vnodes to draw).
function renderSplits(splits) {
  $("splits-card").hidden = splits.length === 0;
  $("splits").replaceChildren(
    ...splits.map((p) =>
      el(
        "tr",
        { class: p.state },
        el("td", { class: "num" }, p.split),
        el("td", {}, p.state.replaceAll("_", " ")),
        el("td", { class: "num" }, p.offset === null ? "–" : fmtInt(p.offset)),
        el("td", { class: "num" }, p.target_offset === null ? "–" : fmtInt(p.target_offset)),
        el("td", { class: "num" }, fmtInt(p.rows)),
      ),
    ),
  );
}

function renderRecoveries(recoveries) {
  const list = $("job-recoveries");
  list.replaceChildren(
    ...recoveries.map((r) =>
      el(
        "li",
        {},
        el("time", { datetime: r.at, text: new Date(r.at).toLocaleTimeString() }),
        r.reason || "no reason given",
      ),
    ),
  );
  if (recoveries.length === 0) list.replaceChildren(el("li", { class: "muted", text: "none" }));
}

function renderHeatmap(vnodes, kind) {
  // a snapshot backfill's vnodes are consuming, then consumed (its snapshot read)
  const snapshot = kind === "snapshot";
  $("legend-in-progress").textContent = snapshot ? "consuming" : "in progress";
  $("legend-completed").textContent = snapshot ? "consumed" : "completed";
  const map = $("heatmap");
  $("heatmap-empty").hidden = vnodes.length > 0;
  if (map.children.length !== vnodes.length) {
    map.replaceChildren(...vnodes.map(() => el("div", { class: "cell" })));
    map.style.gridTemplateColumns = `repeat(${Math.min(32, Math.max(1, vnodes.length))}, 1fr)`;
  }
  const most = Math.max(1, ...vnodes.map((v) => v.rows));
  map.setAttribute(
    "aria-label",
    `Per-vnode progress: ${vnodes.filter((v) => VNODE_LOOK[v.state] === "completed").length} of ${vnodes.length} vnodes done`,
  );
  vnodes.forEach((v, i) => {
    const cell = map.children[i];
    const look = VNODE_LOOK[v.state] || "not_started";
    cell.className = `cell ${look}`;
    cell.dataset.state = v.state;
    // cells under way get darker as they read more rows
    cell.style.opacity = look === "in_progress" ? String(0.35 + 0.65 * (v.rows / most)) : "";
    cell.title = `vnode ${v.vnode}: ${v.state}, ${fmtInt(v.rows)} rows`;
  });
}

function showRateLimit(job) {
  $("rate-limit").value = job.rate_limit === null ? "" : String(job.rate_limit);
}

// Calls the API for a button; its answer (the job) or its error shows at once.
async function act(method, path, body) {
  clearError();
  try {
    const job = await api(method, path, body);
    refreshSoon();
    return job;
  } catch (e) {
    showError(e);
    return null;
  }
}

function renderJobEvents() {
  const id = state.route.id;
  const list = $("job-events");
  const mine = state.events.filter((e) => e.job_id === id).slice(-50).reverse();
  list.replaceChildren(
    ...mine.map((e) => {
      const extra = Object.entries(e.data)
        .filter(([k]) => k !== "job_id" && k !== "at")
        .map(([k, v]) => `${k}=${JSON.stringify(v)}`)
        .join(" ");
      return el(
        "li",
        {},
        el("time", { datetime: e.data.at || "", text: e.data.at ? new Date(e.data.at).toLocaleTimeString() : "" }),
        `${e.kind}${extra ? ` ${extra}` : ""}`,
      );
    }),
  );
  if (mine.length === 0) list.replaceChildren(el("li", { class: "muted", text: "none yet" }));
}

// ---------------------------------------------------------------- live events

// EventSource cannot send a token, so the stream is read with fetch and parsed here
// (the text/event-stream format), reconnecting with Last-Event-ID as a browser would.
async function connectEvents() {
  const live = $("live");
  let lastId = null;
  let retryMs = 2000;
  for (;;) {
    try {
      const token = getToken();
      const headers = withToken({ Accept: "text/event-stream" });
      if (lastId !== null) headers["Last-Event-ID"] = lastId;
      // the first load starts with the latest events; a reconnect resumes after the last
      const url = lastId === null ? `v1/events?recent=${RECENT_EVENTS}` : "v1/events";
      const response = await fetch(url, { headers, cache: "no-store" });
      if (response.status === 401) {
        if (token !== getToken()) continue; // a new one came meanwhile
        askForToken(token ? "The token was not accepted." : "");
        await newToken();
        continue;
      }
      if (!response.ok || !response.body) throw new Error(`HTTP ${response.status}`);
      live.textContent = "live";
      live.classList.add("on");
      const reader = response.body.pipeThrough(new TextDecoderStream()).getReader();
      let buffer = "";
      for (;;) {
        const { value, done } = await reader.read();
        if (done) break;
        buffer += value.replace(/\r\n?/g, "\n");
        let end;
        while ((end = buffer.indexOf("\n\n")) >= 0) {
          const block = buffer.slice(0, end);
          buffer = buffer.slice(end + 2);
          const ev = parseEvent(block);
          if (ev.id !== null) lastId = ev.id;
          if (ev.retry !== null) retryMs = ev.retry;
          if (ev.data !== null) onEvent(ev.type, ev.data);
        }
      }
    } catch (e) {
      // the network or the server went away: try again below
    }
    live.textContent = "reconnecting…";
    live.classList.remove("on");
    await new Promise((resolve) => setTimeout(resolve, retryMs));
  }
}

function parseEvent(block) {
  const ev = { id: null, type: "message", data: null, retry: null };
  for (const line of block.split("\n")) {
    if (line === "" || line.startsWith(":")) continue;
    const colon = line.indexOf(":");
    const field = colon < 0 ? line : line.slice(0, colon);
    let value = colon < 0 ? "" : line.slice(colon + 1);
    if (value.startsWith(" ")) value = value.slice(1);
    if (field === "id") ev.id = value;
    else if (field === "event") ev.type = value;
    else if (field === "data") ev.data = ev.data === null ? value : `${ev.data}\n${value}`;
    else if (field === "retry" && /^\d+$/.test(value)) ev.retry = Number(value);
  }
  return ev;
}

function onEvent(kind, raw) {
  if (!EVENT_KINDS.includes(kind)) return;
  let data = {};
  try {
    data = JSON.parse(raw);
  } catch (e) {
    return;
  }
  state.events.push({ kind, job_id: data.job_id, data });
  if (state.events.length > MAX_EVENTS) state.events.shift();
  state.progress.delete(data.job_id);
  if (state.route.name === "job" && state.route.id === data.job_id) renderJobEvents();
  refreshSoon();
}

// ---------------------------------------------------------------- wiring

function init() {
  takeTokenFromUrl();
  $("token-form").addEventListener("submit", (ev) => {
    ev.preventDefault();
    const token = $("token-input").value.trim();
    if (!token) return;
    $("token-input").value = "";
    $("token-form").hidden = true;
    setToken(token);
    clearError();
    refresh();
  });
  $("error-close").addEventListener("click", clearError);
  $("state-filter").addEventListener("change", (ev) => {
    state.filter = ev.target.value;
    state.pages = [null];
    refresh();
  });
  $("next-page").addEventListener("click", () => {
    if (state.next !== null) state.pages.push(state.next);
    refresh();
  });
  $("first-page").addEventListener("click", () => {
    state.pages = [null];
    refresh();
  });
  $("pause").addEventListener("click", () => act("POST", `v1/jobs/${state.route.id}/pause`));
  $("resume").addEventListener("click", () => act("POST", `v1/jobs/${state.route.id}/resume`));
  $("retry").addEventListener("click", () => act("POST", `v1/jobs/${state.route.id}/retry`));
  $("rate-form").addEventListener("submit", (ev) => {
    ev.preventDefault();
    const raw = $("rate-limit").value.trim();
    if (raw !== "" && !/^-?\d+$/.test(raw)) {
      showError(new Error("rate limit must be a whole number of rows/s, or empty for no limit"));
      return;
    }
    const id = state.route.id;
    act("PATCH", `v1/jobs/${id}`, { rate_limit: raw === "" ? null : Number(raw) }).then((job) => {
      // accepted: the input follows the service again (a rejected edit stays to be fixed)
      if (job && state.route.id === id && $("rate-limit").value.trim() === raw) {
        state.rateEdited = false;
        showRateLimit(job);
      }
    });
  });
  $("rate-limit").addEventListener("input", () => {
    state.rateEdited = true;
  });
  window.addEventListener("hashchange", onRoute);
  setInterval(refresh, POLL_MS);
  connectEvents();
  onRoute();
}

init();
