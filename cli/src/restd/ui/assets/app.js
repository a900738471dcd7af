// Corral's web UI: a page per view (#/queue, #/nodes, #/job/ID, #/shares, #/cluster), each
// drawn from one /ui/api/ call and drawn again every POLL_MS while the tab is visible. Data is
// only ever put in the page as text (never as HTML), so a job name cannot inject markup.
"use strict";

const POLL_MS = 2000;
const AUTH_KEY = "corral.auth";
let me = null;
let timer = null;

// ---- the server ----------------------------------------------------------------------------

function auth() {
  try { return JSON.parse(sessionStorage.getItem(AUTH_KEY) || "null"); } catch (e) { return null; }
}

async function api(path, options) {
  const headers = {};
  const a = auth();
  if (a) { headers["X-SLURM-USER-NAME"] = a.user; headers["X-SLURM-USER-TOKEN"] = a.token; }
  const reply = await fetch("/ui/api/" + path, Object.assign({ headers, cache: "no-store" }, options || {}));
  let body = null;
  try { body = await reply.json(); } catch (e) { body = { error: reply.statusText }; }
  if (!reply.ok) { const err = new Error(body.error || reply.statusText); err.status = reply.status; throw err; }
  return body;
}

// ---- drawing -------------------------------------------------------------------------------

/** An element: h("td", {class: "num"}, "text", child, ...). */
function h(tag, attrs, ...children) {
  const el = tag.startsWith("svg:") ? document.createElementNS("http://www.w3.org/2000/svg", tag.slice(4)) : document.createElement(tag);
  for (const [k, v] of Object.entries(attrs || {})) {
    if (v === null || v === undefined || v === false) continue;
    if (k.startsWith("on")) el.addEventListener(k.slice(2), v);
    else el.setAttribute(k, v === true ? "" : String(v));
  }
  for (const c of children.flat()) {
    if (c === null || c === undefined || c === false) continue;
    el.append(c instanceof Node ? c : document.createTextNode(String(c)));
  }
  return el;
}

function table(headers, rows, id) {
  return h("table", { id }, h("thead", {}, h("tr", {}, headers.map((x) => h("th", { class: /^(GPUs|Shares|Usage|Norm|Effective|Fair|Steps|Tasks|Exit)/.test(x) ? "num" : null }, x)))), h("tbody", {}, rows));
}

function when(ms) {
  if (!ms) return "";
  return new Date(ms).toLocaleString(undefined, { month: "short", day: "numeric", hour: "2-digit", minute: "2-digit", second: "2-digit" });
}

function duration(ms) {
  if (ms === null || ms === undefined) return "";
  let s = Math.max(0, Math.round(ms / 1000));
  const d = Math.floor(s / 86400); s -= d * 86400;
  const hh = Math.floor(s / 3600); s -= hh * 3600;
  const mm = Math.floor(s / 60); s -= mm * 60;
  const t = [hh, mm, s].map((x) => String(x).padStart(2, "0")).join(":");
  return d ? d + "-" + t : t;
}

function relative(ms, now) {
  if (!ms) return "";
  const delta = ms - now;
  return delta <= 0 ? "now" : "in " + duration(delta);
}

/** The colour of a job: the same hue for the same job everywhere. */
function jobColour(job) {
  const hue = (job * 137.508) % 360;
  return "hsl(" + hue.toFixed(0) + ", 62%, 42%)";
}

function stateCell(state) { return h("span", { class: "state state-" + state }, state); }

function jobLink(id) { return h("a", { href: "#/job/" + id, class: "job-link", "data-job": id }, String(id)); }

function mayChange(user) { return me && (me.admin || me.user === user); }

function cancelButton(id, user) {
  if (!mayChange(user)) return "";
  return h("button", {
    class: "danger cancel", "data-job": id, type: "button",
    onclick: async (ev) => {
      ev.target.disabled = true;
      try { await api("job/" + id + "/cancel", { method: "POST" }); say("cancelled job " + id); } catch (e) { say(e.message, true); }
      refresh();
    },
  }, "Cancel");
}

function say(text, bad) {
  const s = document.getElementById("status");
  s.textContent = text;
  s.className = bad ? "error" : "muted";
}

// ---- views ---------------------------------------------------------------------------------

let queueMine = false;

async function queueView() {
  const q = await api("queue" + (queueMine ? "?mine=true" : ""));
  const counts = Object.entries(q.counts).map(([s, n]) => h("span", { class: "chip", "data-state": s }, s + " " + n));
  const mine = h("label", {}, h("input", { type: "checkbox", id: "only-mine", checked: queueMine, onchange: (e) => { queueMine = e.target.checked; refresh(); } }), " only my jobs");
  const rows = q.jobs.map((j) => {
    const pending = j.state === "PENDING";
    const where = pending
      ? h("div", {}, h("span", { class: "reason" }, j.reason), h("div", { class: "reasons" }, j.reasons.join("; ")))
      : j.nodes.join(",");
    return h("tr", { "data-job": j.id, class: "job-row" },
      h("td", {}, jobLink(j.id)), h("td", {}, j.name), h("td", {}, j.user), h("td", {}, j.partition || ""),
      h("td", {}, stateCell(j.state)),
      h("td", { class: "num" }, j.gpus_per_node ? j.gpus_per_node * j.node_count : ""),
      h("td", {}, where),
      h("td", { class: "expected" }, pending ? (j.expected_start_ms ? relative(j.expected_start_ms, q.now_ms) + " (" + when(j.expected_start_ms) + ")" : "not yet known") : ""),
      h("td", {}, j.start_ms ? "ran " + duration(q.now_ms - j.start_ms) : "waited " + duration(q.now_ms - j.submit_ms)),
      h("td", {}, cancelButton(j.id, j.user)));
  });
  const shown = q.jobs.length < q.total ? h("p", { class: "muted" }, "showing the first " + q.jobs.length + " of " + q.total + " jobs") : "";
  return [h("h1", {}, "Queue"), h("div", { class: "chips" }, counts, mine), shown,
    table(["Job", "Name", "User", "Partition", "State", "GPUs", "Nodes or why it waits", "Expected start", "Time", ""], rows, "queue")];
}

let colourBy = "job";

/** The colour of a utilization: red when a held GPU idles, green when it is busy. */
function utilColour(pct) { return "hsl(" + Math.round(1.2 * pct) + ", 60%, 40%)"; }

/** A held device's colour and label: its job's, or its utilization's (`sample`: [gpu, slice,
 * util, mem used, mem total] from /ui/api/utilization). */
function paint(el, holder, sample) {
  if (colourBy === "utilization") {
    const pct = sample ? sample[2] : null;
    el.dataset.util = pct === null || pct === undefined ? "" : pct;
    el.style.background = pct === null || pct === undefined ? "#8a93a3" : utilColour(pct);
    return pct === null || pct === undefined ? "n/a" : pct + "%";
  }
  el.style.background = jobColour(holder.job);
  return "#" + holder.job;
}

function gpuCell(node, g, samples) {
  const title = (h) => "GPU " + g.index + " " + g.model + (h ? " — job " + h.job + " (" + h.user + ")" : " — free") + (g.unhealthy ? " — unhealthy: " + g.unhealthy : "");
  const sampleOf = (slice) => samples.find((s) => s[0] === g.index && s[1] === slice);
  if (g.mig.length) {
    const slices = g.mig.map((m) => {
      const el = h("div", { class: "slice" + (m.holder ? " held" : ""), title: "GPU " + g.index + " " + m.profile + (m.holder ? " — job " + m.holder.job + " (" + m.holder.user + ")" : " — free"), "data-job": m.holder ? m.holder.job : null });
      el.append(m.holder ? m.profile + " " + paint(el, m.holder, sampleOf(Number(m.start_slice))) : m.profile);
      return el;
    });
    return h("div", { class: "gpu mig" + (g.unhealthy ? " unhealthy" : ""), title: title(null), "data-node": node, "data-gpu": g.index }, slices);
  }
  if (g.shared && g.shared.length) {
    const parts = g.shared.map((s) => {
      const el = h("div", { class: "slice held", title: "GPU " + g.index + " — " + s.shards + " shards of job " + s.job + " (" + s.user + ")", "data-job": s.job });
      el.append("shard:" + s.shards + " " + paint(el, s, sampleOf(null)));
      return el;
    });
    return h("div", { class: "gpu mig shared" + (g.unhealthy ? " unhealthy" : ""), title: title(null), "data-node": node, "data-gpu": g.index }, parts);
  }
  const el = h("div", { class: "gpu" + (g.holder ? " held" : "") + (g.unhealthy ? " unhealthy" : ""), title: title(g.holder), "data-node": node, "data-gpu": g.index, "data-job": g.holder ? g.holder.job : null },
    h("b", {}, String(g.index)));
  if (g.holder) {
    const label = paint(el, g.holder, sampleOf(null));
    el.append(h("a", { href: "#/job/" + g.holder.job }, label));
    if (g.unhealthy) el.style.background = "";
  } else {
    el.append("free");
  }
  return el;
}

async function nodesView() {
  const n = await api("nodes");
  const util = colourBy === "utilization" ? await api("utilization") : { nodes: {} };
  const pick = h("select", { id: "colour-by", onchange: (e) => { colourBy = e.target.value; refresh(); } },
    h("option", { value: "job", selected: colourBy === "job" }, "the job holding it"),
    h("option", { value: "utilization", selected: colourBy === "utilization" }, "its utilization"));
  const cards = n.nodes.map((node) => h("div", { class: "node " + node.state, "data-node": node.name },
    h("h3", {}, h("span", {}, node.name), h("span", { class: "muted" }, node.state)),
    h("div", { class: "muted" }, "CPUs " + node.cpus[0] + "/" + node.cpus[1] + " · mem " + Math.round(node.memory_mib[0] / 1024) + "/" + Math.round(node.memory_mib[1] / 1024) + " GiB · " + node.role),
    node.reason ? h("div", { class: "error" }, node.reason) : "",
    h("div", { class: "gpus" }, node.gpus.map((g) => gpuCell(node.name, g, util.nodes[node.name] || [])))));
  const legend = colourBy === "utilization"
    ? "held GPUs coloured by utilization, red (idle) to green (busy), sampled " + when(util.at_ms) + "; grey: free; hatched red: unhealthy"
    : "each square is a GPU (or a MIG instance), coloured by the job holding it; grey: free; hatched red: unhealthy";
  return [h("h1", {}, "Nodes"), h("div", { class: "chips" }, h("label", {}, "Colour each GPU by ", pick)), h("div", { class: "legend" }, h("span", {}, legend)),
    h("div", { class: "grid", id: "nodes" }, cards)];
}

/** A line chart of a node's GPU series: utilization (%) and the most memory used. */
function chart(series) {
  const W = 640, H = 180, L = 36, B = 20, T = 8, R = 44;
  const pts = series.points;
  const svg = h("svg:svg", { class: "chart", width: W, height: H, viewBox: "0 0 " + W + " " + H, "data-node": series.node, "data-points": pts.length });
  if (!pts.length) { svg.append(h("svg:text", { x: L, y: H / 2 }, "no GPU samples from " + series.node)); return svg; }
  const t0 = pts[0][0], t1 = Math.max(pts[pts.length - 1][0], t0 + 1);
  const memMax = Math.max(1, ...pts.map((p) => p[2]));
  const x = (t) => L + (W - L - R) * (t - t0) / (t1 - t0);
  const yU = (u) => T + (H - T - B) * (1 - u / 100);
  const yM = (m) => T + (H - T - B) * (1 - m / memMax);
  svg.append(h("svg:line", { class: "axis", x1: L, y1: H - B, x2: W - R, y2: H - B }), h("svg:line", { class: "axis", x1: L, y1: T, x2: L, y2: H - B }));
  svg.append(h("svg:text", { x: 2, y: T + 8 }, "100%"), h("svg:text", { x: 10, y: H - B }, "0%"), h("svg:text", { x: W - R + 4, y: T + 8 }, memMax + " MiB"));
  svg.append(h("svg:text", { x: L, y: H - 4 }, when(t0)), h("svg:text", { x: W - R - 110, y: H - 4 }, when(t1)));
  const line = (y, key) => pts.map((p, i) => (i ? "L" : "M") + x(p[0]).toFixed(1) + "," + y(p[key]).toFixed(1)).join(" ");
  svg.append(h("svg:path", { class: "util", d: line(yU, 1) }), h("svg:path", { class: "mem", d: line(yM, 2) }));
  for (const p of pts) svg.append(h("svg:circle", { class: "point", cx: x(p[0]).toFixed(1), cy: yU(p[1]).toFixed(1), r: 2, fill: "#2457c5" }));
  return svg;
}

async function jobView(id) {
  const j = await api("job/" + encodeURIComponent(id));
  const field = (k, v) => [h("dt", {}, k), h("dd", { "data-field": k }, v === null || v === undefined || v === "" ? "—" : v)];
  const running = j.state === "RUNNING" || j.state === "PENDING" || j.state === "SUSPENDED";
  const fields = h("dl", { class: "fields", id: "job-fields" },
    field("State", stateCell(j.state)), field("User", j.user), field("Account", j.account), field("Partition", j.partition),
    field("Exit code", j.exit_code), field("Why", j.reasons.join("; ")),
    field("Submitted", when(j.submit_ms)), field("Started", when(j.start_ms)), field("Ended", when(j.end_ms)),
    field("Time limit", j.time_limit_ms ? duration(j.time_limit_ms) : "none"),
    field("Run", j.run), field("Requeues", j.requeues),
    field("Repairs", j.repairs.map((r) => "run " + r.run + " rank " + r.rank + ": " + r.lost + " → " + r.spare + " at " + when(r.at_ms) + " (" + r.reason + ")").join("; ")),
    field("Spare nodes", j.spares.join(", ")),
    field("Nodes", j.nodes.join(", ")), field("GPUs", j.gpus.map((g) => g.node + ": " + g.gpus.join(",")).join("; ")),
    field("GPU-seconds", j.gpu_seconds), field("Mean GPU utilization", j.gpu_utilization_mean_pct + "% (ended runs)"), field("Peak GPU memory", j.gpu_memory_peak_mib + " MiB"));
  const steps = j.steps.map((s) => h("tr", {}, h("td", {}, j.id + "." + s.step), h("td", {}, s.name), h("td", {}, stateCell(s.state)), h("td", {}, s.nodes.join(",")),
    h("td", { class: "num" }, s.ntasks), h("td", {}, when(s.start_ms)), h("td", {}, when(s.end_ms)), h("td", { class: "num" }, s.exit_code + ":" + (s.signal || 0))));
  return [h("h1", {}, "Job " + j.id + " · " + j.name + " ", running ? cancelButton(j.id, j.user) : ""), fields,
    h("h2", {}, "GPU utilization and memory"), h("div", { class: "legend" }, h("span", {}, "solid: utilization (%) · dashed: most memory used by one GPU")),
    h("div", { id: "charts" }, j.series.map((s) => h("div", {}, h("div", { class: "muted" }, s.node), chart(s)))),
    h("h2", {}, "Steps"), j.steps.length ? table(["Step", "Name", "State", "Nodes", "Tasks", "Start", "End", "Exit"], steps, "steps") : h("p", { class: "muted" }, "no steps"),
    h("h2", {}, "Output (end)"), h("pre", { class: "output", id: "output" }, j.output_tail || "(nothing yet)")];
}

async function sharesView() {
  const s = await api("shares");
  const max = Math.max(1e-9, ...s.shares.map((r) => r.effective_usage));
  const rows = s.shares.map((r) => {
    const bar = h("div", { class: "bar" });
    bar.style.width = (100 * r.effective_usage / max).toFixed(1) + "%";
    const name = h("td", {}, r.user ? r.user : r.account);
    name.style.paddingLeft = 8 + 14 * r.depth + "px";
    return h("tr", {}, name, h("td", {}, r.user ? r.account : ""), h("td", { class: "num" }, r.raw_shares), h("td", { class: "num" }, r.norm_shares.toFixed(3)),
      h("td", { class: "num" }, r.usage_gpu_s), h("td", { class: "num" }, r.effective_usage.toFixed(3)), h("td", {}, bar),
      h("td", { class: "num" }, r.fair_share === null ? "" : r.fair_share.toFixed(3)));
  });
  return [h("h1", {}, "Fair share and usage"), table(["Account / user", "Account", "Shares", "Norm shares", "Usage (GPU-s)", "Effective usage", "", "Fair share"], rows, "shares")];
}

async function clusterView() {
  const c = await api("cluster");
  const members = c.members.map((m) => h("tr", {}, h("td", {}, m.name), h("td", {}, m.role + (m.name === c.leader && m.role !== "leader" ? " (leader)" : "")), h("td", {}, m.addr)));
  const troubled = c.troubled.map((n) => h("tr", {}, h("td", {}, n.name), h("td", {}, n.state), h("td", {}, n.reason || ""),
    h("td", {}, n.unhealthy_gpus.map((g) => "GPU " + g[0] + ": " + g[1]).join("; "))));
  return [h("h1", {}, "Cluster"),
    h("dl", { class: "fields", id: "cluster-fields" }, h("dt", {}, "Leader"), h("dd", { id: "leader" }, c.leader || "none"), h("dt", {}, "Term"), h("dd", { id: "term" }, c.term),
      h("dt", {}, "Commit index"), h("dd", {}, c.commit_index), h("dt", {}, "Nodes up"), h("dd", {}, c.nodes_up + " of " + c.nodes_total), h("dt", {}, "Answered by"), h("dd", {}, c.answered_by)),
    h("h2", {}, "Members"), table(["Node", "Role", "Address"], members, "members"),
    h("h2", {}, "Nodes not up or with unhealthy GPUs"), troubled.length ? table(["Node", "State", "Reason", "GPUs"], troubled, "troubled") : h("p", { class: "muted", id: "troubled" }, "every node is up and healthy"),
    h("h2", {}, "Recent node events"), table(["When", "Node", "Event", "Why"], c.events.map((e) => h("tr", { class: "event" }, h("td", {}, when(e.at_ms)), h("td", {}, e.node), h("td", {}, e.what), h("td", {}, e.reason))), "events")];
}

// ---- the page ------------------------------------------------------------------------------

function route() {
  const parts = (location.hash || "#/queue").slice(2).split("/");
  return { view: parts[0] || "queue", arg: parts[1] };
}

async function refresh() {
  clearTimeout(timer);
  const r = route();
  for (const a of document.querySelectorAll("#nav a")) a.classList.toggle("active", a.dataset.view === r.view);
  const draw = { queue: queueView, nodes: nodesView, job: () => jobView(r.arg), shares: sharesView, cluster: clusterView }[r.view] || queueView;
  const view = document.getElementById("view");
  try {
    if (!me) me = await api("me");
    showLogin(false);
    const content = await draw();
    view.replaceChildren(...content);
    view.dataset.view = r.view;
    say("updated " + new Date().toLocaleTimeString());
  } catch (e) {
    if (e.status === 401) { me = null; showLogin(true, auth() ? e.message : ""); return; }
    view.replaceChildren(h("p", { class: "error", id: "view-error" }, e.message));
    view.dataset.view = r.view;
  }
  if (!document.hidden) timer = setTimeout(refresh, POLL_MS);
}

function showLogin(show, why) {
  document.getElementById("login").hidden = !show;
  document.getElementById("view").hidden = show;
  document.getElementById("logout").hidden = show || !auth();
  document.getElementById("who").textContent = me ? me.user + (me.admin ? " (admin)" : "") : "";
  if (show) document.getElementById("login-error").textContent = why || "";
}

document.addEventListener("DOMContentLoaded", () => {
  document.getElementById("login-form").addEventListener("submit", (ev) => {
    ev.preventDefault();
    const user = document.getElementById("login-user").value.trim();
    const token = document.getElementById("login-token").value.trim().replace(/^SLURM_JWT=/, "");
    sessionStorage.setItem(AUTH_KEY, JSON.stringify({ user, token }));
    me = null;
    refresh();
  });
  document.getElementById("logout").addEventListener("click", () => { sessionStorage.removeItem(AUTH_KEY); me = null; refresh(); });
  window.addEventListener("hashchange", refresh);
  document.addEventListener("visibilitychange", () => { if (!document.hidden) refresh(); });
  refresh();
});
