// nemo_gym viewer: one page, hash-routed (#/overview, #/tasks, #/rollout, #/tokens, #/compare).
// Every view fetches its JSON API; plots are inline SVG built here (no libraries, no CDN).
"use strict";

const main = document.getElementById("main");
const picker = document.getElementById("collection-picker");
const progressEl = document.getElementById("progress");
let collections = [];
let pollTimer = null;

function esc(value) {
  return String(value ?? "").replace(/[&<>"']/g, (ch) => ({ "&": "&amp;", "<": "&lt;", ">": "&gt;", '"': "&quot;", "'": "&#39;" })[ch]);
}
function fmt(value, digits = 3) {
  if (value === null || value === undefined || Number.isNaN(value)) return "–";
  return Number.isInteger(value) ? String(value) : Number(value).toFixed(digits);
}
function pct(value) { return value === null || value === undefined ? "–" : `${Number(value).toFixed(1)}%`; }
function el(html) { const t = document.createElement("template"); t.innerHTML = html.trim(); return t.content; }

async function api(path, params) {
  const query = new URLSearchParams();
  for (const [k, v] of Object.entries(params || {})) if (v !== undefined && v !== null && v !== "") query.set(k, v);
  const response = await fetch(`/api/${path}?${query}`, { credentials: "same-origin" });
  const body = await response.json();
  if (!response.ok) throw new Error(body.error || `HTTP ${response.status}`);
  return body;
}

function route() {
  const hash = location.hash.replace(/^#\/?/, "") || "overview";
  const [page, query] = hash.split("?");
  return { page, params: Object.fromEntries(new URLSearchParams(query || "")) };
}
function go(page, params) {
  const query = new URLSearchParams();
  for (const [k, v] of Object.entries(params)) if (v !== undefined && v !== null && v !== "") query.set(k, v);
  location.hash = `#/${page}${query.toString() ? "?" + query : ""}`;
}
function currentCollection() { return Number(route().params.c || picker.value || 0); }

function chipClass(reward) {
  if (reward === null || reward === undefined) return "none";
  if (reward >= 1) return "good";
  if (reward <= 0) return "bad";
  return "mid";
}
function chip(c, row, reward, current) {
  return `<a class="chip ${chipClass(reward)}${current ? " current" : ""}" href="#/rollout?c=${c}&row=${row}" title="row ${row}">${fmt(reward, 2)}</a>`;
}

// ---- plots (inline SVG) ---------------------------------------------------------------
function barChart(bars, { width = 440, height = 180, yLabel = "" } = {}) {
  const pad = { l: 40, r: 8, t: 8, b: 34 };
  const max = Math.max(1, ...bars.map((b) => b.count));
  const w = (width - pad.l - pad.r) / Math.max(1, bars.length);
  const h = height - pad.t - pad.b;
  let svg = `<svg viewBox="0 0 ${width} ${height}" role="img">`;
  svg += `<line x1="${pad.l}" y1="${pad.t + h}" x2="${width - pad.r}" y2="${pad.t + h}" stroke="#999"/>`;
  svg += `<text x="${pad.l - 4}" y="${pad.t + 8}" text-anchor="end">${max}</text><text x="${pad.l - 4}" y="${pad.t + h}" text-anchor="end">0</text>`;
  bars.forEach((b, i) => {
    const bh = (b.count / max) * h;
    const x = pad.l + i * w;
    svg += `<rect class="bar" x="${x + 1}" y="${pad.t + h - bh}" width="${Math.max(1, w - 2)}" height="${bh}" fill="#2f6fdf"><title>${esc(b.label)}: ${b.count}</title></rect>`;
    if (bars.length <= 12 || i % Math.ceil(bars.length / 8) === 0)
      svg += `<text x="${x + w / 2}" y="${pad.t + h + 12}" text-anchor="middle">${esc(b.label)}</text>`;
  });
  svg += `<text x="${pad.l + (width - pad.l) / 2}" y="${height - 4}" text-anchor="middle">${esc(yLabel)}</text>`;
  return svg + "</svg>";
}
function areaChart(values, { width = 440, height = 180, xLabel = "", yMax = 1 } = {}) {
  const pad = { l: 40, r: 8, t: 8, b: 34 };
  const h = height - pad.t - pad.b, w = width - pad.l - pad.r;
  let svg = `<svg viewBox="0 0 ${width} ${height}" role="img">`;
  svg += `<line x1="${pad.l}" y1="${pad.t + h}" x2="${width - pad.r}" y2="${pad.t + h}" stroke="#999"/>`;
  svg += `<text x="${pad.l - 4}" y="${pad.t + 8}" text-anchor="end">${yMax === 1 ? "100%" : yMax}</text><text x="${pad.l - 4}" y="${pad.t + h}" text-anchor="end">0</text>`;
  if (values.length) {
    const step = w / values.length;
    let path = `M ${pad.l} ${pad.t + h}`;
    values.forEach((v, i) => {
      const y = pad.t + h - (v / yMax) * h;
      path += ` L ${pad.l + i * step} ${y} L ${pad.l + (i + 1) * step} ${y}`;
    });
    path += ` L ${pad.l + w} ${pad.t + h} Z`;
    svg += `<path class="area" d="${path}" fill="#1a9b55" fill-opacity="0.35" stroke="#1a9b55"/>`;
  }
  svg += `<text x="${pad.l + w / 2}" y="${height - 4}" text-anchor="middle">${esc(xLabel)}</text>`;
  return svg + "</svg>";
}
function lineChart(series, { width = 440, height = 180, xLabel = "k" } = {}) {
  const pad = { l: 40, r: 8, t: 8, b: 34 };
  const h = height - pad.t - pad.b, w = width - pad.l - pad.r;
  const ks = series.flatMap((s) => s.points.map((p) => p.k));
  const maxK = Math.max(1, ...ks);
  const colors = ["#2f6fdf", "#d0413a", "#1a9b55", "#d99a1e", "#7b4fd0"];
  const x = (k) => pad.l + (maxK === 1 ? w / 2 : ((Math.log2(k)) / Math.log2(maxK)) * w);
  const y = (v) => pad.t + h - (v / 100) * h;
  let svg = `<svg viewBox="0 0 ${width} ${height}" role="img">`;
  svg += `<line x1="${pad.l}" y1="${pad.t + h}" x2="${width - pad.r}" y2="${pad.t + h}" stroke="#999"/>`;
  svg += `<text x="${pad.l - 4}" y="${pad.t + 8}" text-anchor="end">100%</text><text x="${pad.l - 4}" y="${pad.t + h}" text-anchor="end">0</text>`;
  [...new Set(ks)].forEach((k) => { svg += `<text x="${x(k)}" y="${pad.t + h + 12}" text-anchor="middle">${k}</text>`; });
  series.forEach((s, i) => {
    const color = colors[i % colors.length];
    const d = s.points.map((p, j) => `${j ? "L" : "M"} ${x(p.k)} ${y(p.pass)}`).join(" ");
    svg += `<path d="${d}" fill="none" stroke="${color}" stroke-width="2"/>`;
    s.points.forEach((p) => { svg += `<circle class="point" cx="${x(p.k)}" cy="${y(p.pass)}" r="3" fill="${color}"><title>${esc(s.name)} pass@${p.k} = ${p.pass.toFixed(1)}%</title></circle>`; });
    svg += `<text x="${pad.l + 6}" y="${pad.t + 12 + 12 * i}" fill="${color}" style="fill:${color}">${esc(s.name)}</text>`;
  });
  svg += `<text x="${pad.l + w / 2}" y="${height - 4}" text-anchor="middle">${esc(xLabel)}</text>`;
  return svg + "</svg>";
}

// ---- header ----------------------------------------------------------------------------
async function loadCollections() {
  const body = await api("collections");
  collections = body.collections;
  const selected = currentCollection();
  picker.innerHTML = collections.map((c, i) => `<option value="${i}">${i}: ${esc(shortName(c))}</option>`).join("");
  picker.value = String(Math.min(selected, collections.length - 1));
  document.getElementById("nav-compare").style.display = collections.length > 1 ? "" : "none";
  showProgress(collections[Number(picker.value)]);
}
// Collections often share a file name (rollouts.jsonl in two run folders): show the folder too.
function shortName(c) {
  const clash = collections.filter((o) => o.name === c.name).length > 1;
  return clash ? c.path.split("/").slice(-2).join("/") : c.name;
}
function showProgress(summary) {
  if (!summary) return;
  const expected = summary.expected ? ` / ${summary.expected}` : "";
  progressEl.textContent = `${summary.rows}${expected} rollouts, ${summary.failures} failed${summary.complete || !summary.expected ? "" : " — collecting"}`;
  progressEl.classList.toggle("live", Boolean(summary.expected) && !summary.complete);
  progressEl.id = "progress";
}
picker.addEventListener("change", () => {
  const { page, params } = route();
  const target = ["rollout", "tokens"].includes(page) ? "tasks" : page;
  go(target, { ...params, c: picker.value, row: undefined, offset: undefined });
});

// ---- Overview -------------------------------------------------------------------------
async function overview(params) {
  const c = Number(params.c || 0);
  const o = await api("overview", { c });
  showProgress(o);
  const failureRows = Object.entries(o.failures_by_class).map(([k, v]) => `<tr><td>${esc(k)}</td><td class="num">${v}</td></tr>`).join("")
    || `<tr><td colspan="2" class="muted">no failures</td></tr>`;
  const maxK = Math.max(0, ...o.agents.flatMap((a) => a.pass_at_k.map((p) => p.k)));
  const agentRows = o.agents.map((a) => {
    const passes = a.pass_at_k.map((p) => `pass@${p.k} ${pct(p.pass)}`).join(" · ");
    return `<tr class="agent-row"><td><a href="#/tasks?c=${c}&agent=${encodeURIComponent(a.agent)}">${esc(a.agent)}</a></td>
      <td class="num">${a.rollouts}</td><td class="num">${a.tasks}</td><td class="num agent-mean">${fmt(a.mean_reward)}</td>
      <td>${esc(passes)}</td>
      <td class="num"><a href="#/tasks?c=${c}&agent=${encodeURIComponent(a.agent)}&status=never">${a.solved_never}</a></td>
      <td class="num"><a href="#/tasks?c=${c}&agent=${encodeURIComponent(a.agent)}&status=always">${a.solved_always}</a></td></tr>`;
  }).join("");
  const metrics = (o.metrics_file || []).map((m) => `<tr><td>${esc(m.agent_ref && m.agent_ref.name)}</td><td>${
    Object.entries(m.key_metrics).map(([k, v]) => `${esc(k)} = ${(m.units || {})[k] === "%" ? pct(v) : fmt(v, 4)}`).join("<br>")}</td></tr>`).join("");
  const series = [{ name: "all", points: o.pass_at_k }];
  if (o.agents.length > 1) o.agents.forEach((a) => series.push({ name: a.agent, points: a.pass_at_k }));
  main.replaceChildren(el(`
    <h1>Overview <span class="muted">${esc(o.name)}</span></h1>
    <div class="cards">
      <div class="card"><div class="value" id="stat-rollouts">${o.rows}</div><div class="label">rollouts</div></div>
      <div class="card"><div class="value" id="stat-failures">${o.failures}</div><div class="label">failed</div></div>
      <div class="card"><div class="value" id="stat-tasks">${o.num_tasks}</div><div class="label">tasks</div></div>
      <div class="card"><div class="value" id="stat-mean-reward">${fmt(o.mean_reward)}</div><div class="label">mean reward</div></div>
      <div class="card"><div class="value" id="stat-pass1">${o.pass_at_k.length ? pct(o.pass_at_k[0].pass) : "–"}</div><div class="label">pass@1</div></div>
      <div class="card"><div class="value" id="stat-token-rows">${o.rows_with_token_ids}</div><div class="label">with token IDs</div></div>
    </div>
    <div class="plots">
      <div class="plot" id="plot-rewards"><h3>Reward distribution (rollouts)</h3>${barChart(o.reward_histogram.bars, { yLabel: "reward" })}</div>
      <div class="plot" id="plot-pass-rates"><h3>Pass rate per task, sorted (${o.num_tasks} tasks)</h3>${areaChart(o.task_pass_rates, { xLabel: "tasks, best to worst" })}</div>
      <div class="plot" id="plot-pass-at-k"><h3>pass@k against k${maxK ? ` (k ≤ ${maxK})` : ""}</h3>${lineChart(series)}</div>
    </div>
    <h2>Per agent</h2>
    <table id="agents"><thead><tr><th>agent</th><th class="num">rollouts</th><th class="num">tasks</th><th class="num">mean reward</th><th>pass@k</th><th class="num">solved never</th><th class="num">solved always</th></tr></thead><tbody>${agentRows}</tbody></table>
    <h2>Failures by class</h2>
    <table id="failures"><thead><tr><th>class</th><th class="num">rollouts</th></tr></thead><tbody>${failureRows}</tbody></table>
    ${o.failure_samples.length ? `<h2>Failed rollouts${o.failures > o.failure_samples.length ? ` (first ${o.failure_samples.length})` : ""}</h2>
    <p class="muted">Failures are never scored: they are infrastructure or agent errors, kept apart from the results.</p>
    <table id="failure-samples"><thead><tr><th class="num">task</th><th class="num">rollout</th><th>class</th><th>error</th></tr></thead><tbody>${
      o.failure_samples.map((f) => `<tr class="failure-row"><td class="num"><a href="#/tasks?c=${c}&status=failed">${esc(f.task ?? "–")}</a></td><td class="num">${esc(f.rollout ?? "–")}</td><td>${esc(f.class)}</td><td class="prompt">${esc(f.error)}</td></tr>`).join("")}</tbody></table>` : ""}
    ${metrics ? `<h2>Metrics file (key metrics; pass@k and majority@k in percent, means as fractions)</h2><table id="metrics-file"><tbody>${metrics}</tbody></table>` : ""}
    ${provenanceHtml(o.provenance)}
    <p class="muted">${esc(o.path)} · ${o.bytes} bytes indexed${o.bad_lines ? ` · ${o.bad_lines} lines that are not JSON objects` : ""}</p>`));
  // Refresh while a collection is running: rows still expected, or the file changed lately.
  if ((o.expected && !o.complete) || (o.modified_s_ago !== null && o.modified_s_ago < 30)) pollTimer = setTimeout(render, 2000);
}

function provenanceHtml(p) {
  if (!p || (!p.lock && !p.job)) return "";
  const rows = [];
  if (p.job) {
    rows.push(["submission", `${esc(p.job.gym_job_id)} on ${esc(p.job.cluster)} (${esc(p.job.executor)}), ${esc(p.job.submitted_at)} by ${esc(p.job.submitted_by)}`]);
    for (const b of p.job.benchmarks || []) {
      const jobs = [...(b.previous_job_ids || []), b.job_id].filter(Boolean).join(" → ");
      rows.push([`benchmark ${esc(b.benchmark)}`, b.job_id ? `Slurm job(s) ${esc(jobs)}` : `not submitted: ${esc(b.error)}`]);
    }
    rows.push(["gym", `${esc(p.job.gym_version)}${p.job.gym_commit ? " @ " + esc(p.job.gym_commit) : ""}`]);
  }
  if (p.lock) {
    if (p.lock.error) rows.push(["run lock", `${esc(p.lock.path)}: ${esc(p.lock.error)}`]);
    else {
      rows.push(["run lock", esc(p.lock.path) + (p.lock.overrides ? ` · <b>${p.lock.overrides} forced resume(s)</b>` : "")]);
      rows.push(["folders", Object.entries(p.lock.folders).map(([k, v]) => `${esc(k)} (${v} files)`).join("<br>")]);
      if (p.lock.data_file && p.lock.data_file.path) rows.push(["data file", `${esc(p.lock.data_file.path)} · sha256 ${esc((p.lock.data_file.sha256 || "").slice(0, 12))}`]);
      const model = Object.entries(p.lock.model || {}).map(([k, v]) => `${esc(k)} = ${esc(v)}`).join("<br>");
      if (model) rows.push(["model", model]);
    }
  }
  return `<h2>Provenance</h2><table id="provenance"><tbody>${rows.map(([k, v]) => `<tr><td>${k}</td><td>${v}</td></tr>`).join("")}</tbody></table>`;
}

// ---- Tasks ----------------------------------------------------------------------------
async function tasks(params) {
  const c = Number(params.c || 0);
  const limit = 50, offset = Number(params.offset || 0);
  const [o, t] = await Promise.all([
    api("overview", { c }),
    api("tasks", { c, agent: params.agent, min: params.min, max: params.max, status: params.status, q: params.q, sort: params.sort, offset, limit }),
  ]);
  showProgress(o);
  const option = (value, label, current) => `<option value="${esc(value)}"${String(current ?? "") === String(value) ? " selected" : ""}>${esc(label)}</option>`;
  const agents = [option("", "all", params.agent), ...o.agents.map((a) => option(a.agent, a.agent, params.agent))].join("");
  const statuses = [["any", "any"], ["failed", "has failed rollouts"], ["never", "solved never"], ["always", "solved always"], ["mixed", "solved sometimes"]]
    .map(([v, l]) => option(v, l, params.status || "any")).join("");
  const sorts = [["task", "task index"], ["reward", "mean reward ↑"], ["-reward", "mean reward ↓"]].map(([v, l]) => option(v, l, params.sort || "task")).join("");
  const rows = t.tasks.map((task) => `<tr class="task-row" data-task="${task.task}">
      <td class="num">${task.task < 0 ? "–" : task.task}</td><td>${esc(task.agent)}</td><td class="num">${task.n}</td>
      <td class="num task-mean">${fmt(task.mean_reward)}</td>
      <td>${task.rows.map((row, i) => chip(c, row, task.rewards[i])).join("")}</td>
      <td class="num">${task.failures || ""}</td><td class="prompt">${esc(task.prompt)}</td></tr>`).join("")
    || `<tr><td colspan="7" class="muted">no task matches these filters</td></tr>`;
  main.replaceChildren(el(`
    <h1>Tasks <span class="muted">${esc(o.name)}</span></h1>
    <form class="filters" id="task-filters">
      <label>agent / environment<select name="agent">${agents}</select></label>
      <label>mean reward ≥<input type="number" step="any" name="min" value="${esc(params.min)}"></label>
      <label>mean reward ≤<input type="number" step="any" name="max" value="${esc(params.max)}"></label>
      <label>status<select name="status">${statuses}</select></label>
      <label>search prompts<input type="search" name="q" value="${esc(params.q)}" placeholder="text in the prompt"></label>
      <label>sort<select name="sort">${sorts}</select></label>
      <button type="submit">Apply</button>
    </form>
    <p><span id="tasks-total">${t.total}</span> tasks match.</p>
    <table id="tasks"><thead><tr><th class="num">task</th><th>agent</th><th class="num">repeats</th><th class="num">mean</th><th>rewards (click to open)</th><th class="num">failed</th><th>prompt</th></tr></thead><tbody>${rows}</tbody></table>
    <div class="pager">
      ${offset > 0 ? `<a href="#" id="prev">← previous</a>` : ""}
      <span class="muted">${t.total ? offset + 1 : 0}–${Math.min(offset + limit, t.total)} of ${t.total}</span>
      ${offset + limit < t.total ? `<a href="#" id="next">next →</a>` : ""}
    </div>`));
  const form = document.getElementById("task-filters");
  const submit = (event) => {
    if (event) event.preventDefault();
    const data = Object.fromEntries(new FormData(form));
    go("tasks", { c, ...data, status: data.status === "any" ? "" : data.status, sort: data.sort === "task" ? "" : data.sort });
  };
  form.addEventListener("submit", submit);
  form.querySelectorAll("select").forEach((s) => s.addEventListener("change", submit));
  const page = (delta) => (event) => { event.preventDefault(); go("tasks", { ...params, c, offset: Math.max(0, offset + delta) }); };
  document.getElementById("prev")?.addEventListener("click", page(-limit));
  document.getElementById("next")?.addEventListener("click", page(limit));
}

// ---- Rollout ----------------------------------------------------------------------------
function textOf(content) {
  if (typeof content === "string") return content;
  if (Array.isArray(content)) return content.map((p) => (p && (p.text ?? p.output ?? "")) || "").join("\n");
  return content === undefined || content === null ? "" : JSON.stringify(content, null, 2);
}
// Images show inline only as data: URLs of raster types (no remote fetch, no SVG); the page's CSP
// (img-src 'self' data:) enforces the same. Anything else is named, escaped, never loaded.
const SAFE_IMAGE = /^data:image\/(png|jpeg|gif|webp);base64,[A-Za-z0-9+\/=\s]*$/;
const IMAGE_PARTS = new Set(["input_image", "image_url", "image"]);
const VIDEO_PARTS = new Set(["input_video", "video_url", "video"]);
function mediaSource(part) {
  const raw = part.image_url ?? part.video_url ?? part.video ?? part.url ?? part.file_url ?? part.filename ?? part.file_id ?? "";
  return typeof raw === "string" ? raw : (raw && typeof raw.url === "string" ? raw.url : "");
}
function short(text) { return text.length > 80 ? `${text.slice(0, 77)}…` : text; }
function renderContent(content) {
  if (!Array.isArray(content) || !content.some((p) => p && (IMAGE_PARTS.has(p.type) || VIDEO_PARTS.has(p.type) || p.type === "input_file" || p.type === "file")))
    return `<pre>${esc(textOf(content))}</pre>`;
  const html = [];
  let text = [];
  const flush = () => { if (text.length) html.push(`<pre>${esc(text.join("\n"))}</pre>`); text = []; };
  for (const part of content) {
    if (!part || typeof part !== "object") continue;
    if (IMAGE_PARTS.has(part.type)) {
      flush();
      const url = mediaSource(part);
      html.push(SAFE_IMAGE.test(url)
        ? `<img class="part-image" alt="image" src="${esc(url)}">`
        : `<div class="media muted">[image not shown: ${esc(short(url) || "no data: URL")}; only data: URLs are displayed]</div>`);
    } else if (VIDEO_PARTS.has(part.type)) {
      flush();
      html.push(`<div class="media muted">[video: ${esc(short(mediaSource(part)))}]</div>`);
    } else if (part.type === "input_file" || part.type === "file") {
      flush();
      const file = part.file && typeof part.file === "object" ? part.file : part;
      html.push(`<div class="media muted">[file: ${esc(short(file.filename || file.file_id || file.file_url || "inline data"))}]</div>`);
    } else text.push(part.text ?? part.output ?? "");
  }
  flush();
  return html.join("");
}
function prettyJson(text) {
  try { return JSON.stringify(JSON.parse(text), null, 2); } catch { return text; }
}
function renderItem(item) {
  if (typeof item === "string") return `<div class="item user"><div class="role">user</div><pre>${esc(item)}</pre></div>`;
  const type = item.type || (item.role ? "message" : "item");
  if (type === "message") {
    const role = item.role || "assistant";
    return `<div class="item ${esc(role)}"><div class="role">${esc(role)}</div>${renderContent(item.content)}</div>`;
  }
  if (type === "reasoning") {
    const text = textOf(item.summary && item.summary.length ? item.summary : item.content);
    return `<div class="item reasoning"><div class="role">reasoning</div><pre>${esc(text)}</pre></div>`;
  }
  if (type === "function_call")
    return `<div class="item function_call"><div class="role">tool call · ${esc(item.name)}</div><pre>${esc(prettyJson(item.arguments || ""))}</pre></div>`;
  if (type === "function_call_output") {
    const body = Array.isArray(item.output) ? renderContent(item.output)
      : `<pre>${esc(prettyJson(typeof item.output === "string" ? item.output : JSON.stringify(item.output)))}</pre>`;
    return `<div class="item function_call_output"><div class="role">tool output</div>${body}</div>`;
  }
  return `<div class="item"><div class="role">${esc(type)}</div><pre>${esc(JSON.stringify(item, null, 2))}</pre></div>`;
}
const HIDDEN_FIELDS = new Set(["responses_create_params", "response", "agent_ref"]);
function conversation(c, page, current) {
  const data = page.data;
  if (data._ng_viewer_bad_line !== undefined)
    return `<div class="convo"><div class="error">Line ${page.row + 1} is not a JSON object: ${esc(data.error)}</div><pre>${esc(data._ng_viewer_bad_line)}</pre></div>`;
  const params = data.responses_create_params || {};
  const input = typeof params.input === "string" ? [params.input] : params.input || [];
  const output = (data.response && data.response.output) || [];
  const diagnostics = Object.entries(data).filter(([k]) => !HIDDEN_FIELDS.has(k) && k !== "reward");
  const tools = (params.tools || []).map((t) => esc(t.name || t.type)).join(", ");
  return `<div class="convo" data-row="${page.row}">
    <h3>${chip(c, page.row, data.reward ?? null, current)} row ${page.row} · rollout ${esc(data._ng_rollout_index ?? "–")}
      ${page.has_token_ids ? `<a href="#/tokens?c=${c}&row=${page.row}">tokens</a>` : ""}</h3>
    ${tools ? `<div class="muted">tools: ${tools}</div>` : ""}
    ${input.map(renderItem).join("")}
    ${output.map(renderItem).join("")}
    ${data.response && data.response.status && data.response.status !== "completed" ? `<div class="muted">response status: ${esc(data.response.status)} ${esc(JSON.stringify(data.response.incomplete_details || ""))}</div>` : ""}
    <div class="item verify"><div class="role">verify</div>
      <div class="kv"><span class="k">reward</span><span class="verify-reward">${fmt(data.reward ?? null, 4)}</span>
      ${diagnostics.map(([k, v]) => `<span class="k">${esc(k)}</span><pre>${esc(typeof v === "string" ? v : JSON.stringify(v, null, 2))}</pre>`).join("")}</div></div>
  </div>`;
}
async function rollout(params) {
  const c = Number(params.c || 0), row = Number(params.row || 0);
  const page = await api("rollout", { c, row });
  const others = page.repeats.filter((r) => r.row !== row).slice(0, 3);
  const pages = [page, ...(await Promise.all(others.map((r) => api("rollout", { c, row: r.row }))))];
  main.replaceChildren(el(`
    <h1>Rollout <span class="muted">task ${page.task ?? "–"} · ${esc(page.agent)}</span></h1>
    <p class="pager">${row > 0 ? `<a id="prev-row" href="#/rollout?c=${c}&row=${row - 1}">← row ${row - 1}</a>` : ""}
      <span class="muted">row ${row} of ${page.rows}</span>
      ${row + 1 < page.rows ? `<a id="next-row" href="#/rollout?c=${c}&row=${row + 1}">row ${row + 1} →</a>` : ""}</p>
    <p>Repeats of this task: ${page.repeats.map((r) => chip(c, r.row, r.reward, r.row === row)).join("")}
      ${page.repeats.length > 4 ? `<span class="muted">(showing 4 side by side)</span>` : ""}</p>
    <div class="repeats">${pages.map((p, i) => conversation(c, p, i === 0)).join("")}</div>`));
}

// ---- Tokens -----------------------------------------------------------------------------
async function tokens(params) {
  const c = Number(params.c || 0), row = Number(params.row || 0);
  const t = await api("tokens", { c, row });
  const header = `<h1>Tokens <span class="muted">row ${row} · task ${t.task ?? "–"}</span></h1>
    <p><a href="#/rollout?c=${c}&row=${row}">← conversation</a> · repeats: ${t.repeats.map((r) => `<a href="#/tokens?c=${c}&row=${r.row}">${r.row}</a>`).join(" ")}</p>`;
  if (!t.available) {
    main.replaceChildren(el(`${header}<div class="error" id="tokens-unavailable">No training sequence: ${esc(t.reason)}</div>`));
    return;
  }
  const v = t.verdict;
  const verdict = v.contiguous
    ? `<div class="verdict ok" id="verdict">Contiguous: all ${v.num_calls} model calls extend one sequence${v.replaced_turn_ends ? ` (${v.replaced_turn_ends} turn-end token replaced)` : ""}.</div>`
    : `<div class="verdict broken" id="verdict">Not contiguous: call ${v.break_at_call} does not extend the sequence; the trainer gets calls 0–${v.break_at_call - 1} of ${v.num_calls}.</div>`;
  const starts = new Set(t.calls.map((s) => s.generation_start));
  const spans = t.tokens.map(([id, mask, lp, call], i) => {
    const text = t.decoded ? t.tokens[i][4] : `${id} `;
    const title = `id ${id} · ${mask ? `trained · logprob ${lp}` : "not trained (mask 0)"} · call ${call} · position ${i}`;
    return `<span class="tok m${mask}${starts.has(i) ? " callstart" : ""}" title="${esc(title)}" data-lp="${lp}">${esc(text)}</span>`;
  }).join("");
  main.replaceChildren(el(`${header}${verdict}
    <div class="cards">
      <div class="card"><div class="value" id="tok-length">${t.length}</div><div class="label">tokens</div></div>
      <div class="card"><div class="value" id="tok-trained">${t.trained_tokens}</div><div class="label">trained (mask 1)</div></div>
      <div class="card"><div class="value">${v.num_calls}</div><div class="label">model calls</div></div>
      <div class="card"><div class="value">${fmt(t.mean_logprob)}</div><div class="label">mean logprob (trained)</div></div>
      <div class="card"><div class="value">${fmt(t.reward)}</div><div class="label">reward</div></div>
    </div>
    <p class="legend"><span class="tok m1">trained: policy sampled (mask 1)</span><span class="tok m0">context: prompt, tools, template (mask 0)</span>
      <span class="muted">${t.decoded ? "decoded with the configured tokenizer" : "token IDs (start ng_viewer with +tokenizer=… to decode)"} · hover a token for its log-prob</span></p>
    <div class="tokens" id="tokens">${spans}</div>`));
}

// ---- Compare ----------------------------------------------------------------------------
async function comparePage(params) {
  if (collections.length < 2) {
    main.replaceChildren(el(`<h1>Compare</h1><p class="muted">Open two collections: ng_viewer +input=a.jsonl,b.jsonl</p>`));
    return;
  }
  const a = Number(params.a ?? 0), b = Number(params.b ?? 1), show = params.show || "all";
  const offset = Number(params.offset || 0), limit = 50;
  const r = await api("compare", { a, b, show, offset, limit });
  const option = (i, cur) => `<option value="${i}"${i === cur ? " selected" : ""}>${i}: ${esc(shortName(collections[i]))}</option>`;
  const shows = [["all", "all common tasks"], ["changed", "reward changed"], ["flipped", "flipped"], ["gained", "gained (fail → pass)"], ["lost", "lost (pass → fail)"]]
    .map(([v, l]) => `<option value="${v}"${v === show ? " selected" : ""}>${l}</option>`).join("");
  const rows = r.tasks.map((t) => `<tr class="compare-row" data-task="${t.task}">
      <td class="num">${t.task}</td><td class="num">${fmt(t.mean_a)}</td><td class="num">${fmt(t.mean_b)}</td>
      <td class="num delta ${t.delta > 0 ? "up" : t.delta < 0 ? "down" : ""}">${t.delta > 0 ? "+" : ""}${fmt(t.delta)}</td>
      <td>${t.flip ? `<span class="badge ${t.flip}">${t.flip}</span>` : ""}</td>
      <td>${t.rows_a.slice(0, 8).map((row) => `<a href="#/rollout?c=${a}&row=${row}">${row}</a>`).join(" ")}</td>
      <td>${t.rows_b.slice(0, 8).map((row) => `<a href="#/rollout?c=${b}&row=${row}">${row}</a>`).join(" ")}</td>
      <td class="prompt">${esc(t.prompt)}${t.prompt_b !== null && t.prompt_b !== undefined ? `<div class="warning">B: ${esc(t.prompt_b)}</div>` : ""}</td></tr>`).join("") || `<tr><td colspan="8" class="muted">no task to show</td></tr>`;
  main.replaceChildren(el(`
    <h1>Compare</h1>
    <form class="filters" id="compare-form">
      <label>A (before)<select name="a">${collections.map((_, i) => option(i, a)).join("")}</select></label>
      <label>B (after)<select name="b">${collections.map((_, i) => option(i, b)).join("")}</select></label>
      <label>show<select name="show">${shows}</select></label>
    </form>
    <div class="cards">
      <div class="card"><div class="value" id="cmp-common">${r.common_tasks}</div><div class="label">tasks in both</div></div>
      <div class="card"><div class="value" id="cmp-mean-a">${fmt(r.mean_a)}</div><div class="label">mean reward A</div></div>
      <div class="card"><div class="value" id="cmp-mean-b">${fmt(r.mean_b)}</div><div class="label">mean reward B</div></div>
      <div class="card"><div class="value" id="cmp-gained">${r.gained}</div><div class="label">gained</div></div>
      <div class="card"><div class="value" id="cmp-lost">${r.lost}</div><div class="label">lost</div></div>
    </div>
    ${r.warning ? `<p class="warning" id="compare-warning">⚠ ${esc(r.warning)}</p>` : ""}
    <p class="muted">A task passes when at least half its repeats are solved. Only in A: ${r.only_a} · only in B: ${r.only_b}. Sorted by the size of the change.</p>
    <p><span id="compare-total">${r.total}</span> tasks shown.</p>
    <table id="compare"><thead><tr><th class="num">task</th><th class="num">mean A</th><th class="num">mean B</th><th class="num">change</th><th>flip</th><th>rows A</th><th>rows B</th><th>prompt</th></tr></thead><tbody>${rows}</tbody></table>
    <div class="pager">
      ${offset > 0 ? `<a href="#/compare?a=${a}&b=${b}&show=${show}&offset=${Math.max(0, offset - limit)}">← previous</a>` : ""}
      ${offset + limit < r.total ? `<a href="#/compare?a=${a}&b=${b}&show=${show}&offset=${offset + limit}">next →</a>` : ""}
    </div>`));
  const form = document.getElementById("compare-form");
  form.querySelectorAll("select").forEach((s) => s.addEventListener("change", () => go("compare", Object.fromEntries(new FormData(form)))));
}

// ---- router -----------------------------------------------------------------------------
const PAGES = { overview, tasks, rollout, tokens, compare: comparePage };
async function render() {
  clearTimeout(pollTimer);
  const { page, params } = route();
  document.querySelectorAll("header nav a").forEach((a) => a.classList.toggle("active", a.dataset.page === page));
  if (params.c !== undefined && picker.value !== params.c) picker.value = params.c;
  document.querySelectorAll("header nav a").forEach((a) => {
    if (a.dataset.page !== "compare") a.href = `#/${a.dataset.page}?c=${picker.value || 0}`;
  });
  const view = PAGES[page] || overview;
  try {
    await view(params);
    document.body.dataset.loaded = page;
  } catch (error) {
    main.replaceChildren(el(`<div class="error" id="page-error">${esc(error.message)}</div>`));
    document.body.dataset.loaded = "error";
  }
}
window.addEventListener("hashchange", () => { document.body.dataset.loaded = ""; render(); });
loadCollections().then(render).catch((error) => {
  main.replaceChildren(el(`<div class="error" id="page-error">${esc(error.message)}</div>`));
});
