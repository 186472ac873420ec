// OpenForgeRL dashboard: a hash-routed page over the JSON endpoints of `openforge dash`.
//   #/                  runs and their manifests
//   #/run/<run_id>      step metric curves (inline SVG) and the rollouts table with filters
//   #/rollout/<id>      the trajectory: calls (request, answer, splice report), samples
//                       (tokens coloured by loss mask), verifier output
"use strict";

const app = document.getElementById("app");
const crumbs = document.getElementById("crumbs");
const STATUSES = ["PENDING", "RUNNING", "SUCCEEDED", "FAILED", "TIMED_OUT", "CANCELLED"];

// h("tag.class", {attr: value}, child...) builds an element; strings become text nodes.
function h(spec, attrs, ...children) {
  const [tag, ...classes] = spec.split(".");
  const el = document.createElement(tag);
  if (classes.length) el.className = classes.join(" ");
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

const SVG_NS = "http://www.w3.org/2000/svg";
function s(tag, attrs, ...children) {
  const el = document.createElementNS(SVG_NS, tag);
  for (const [k, v] of Object.entries(attrs || {})) el.setAttribute(k, String(v));
  for (const c of children) el.append(c instanceof Node ? c : document.createTextNode(String(c)));
  return el;
}

async function api(path) {
  const resp = await fetch(path, { headers: { Accept: "application/json" } });
  const body = await resp.json().catch(() => ({}));
  if (!resp.ok) {
    const err = body.error || {};
    throw new Error(`${err.code || resp.status}: ${err.message || resp.statusText}`);
  }
  return body;
}

function fmt(x, digits = 3) {
  if (x === null || x === undefined) return "–";
  if (typeof x !== "number") return String(x);
  if (Number.isInteger(x)) return String(x);
  return x.toFixed(digits);
}

const enc = encodeURIComponent;
const slug = (name) => name.replace(/[^A-Za-z0-9]+/g, "-").replace(/^-|-$/g, "");
const statusCell = (st) => h("span.status.status-" + st, {}, st);

function setCrumbs(...items) {
  crumbs.replaceChildren(...items.map(([label, href]) => (href ? h("a", { href }, label) : h("span", {}, label))));
}

// Replaces the page's content with the given nodes (null/false entries are skipped).
function render(...nodes) {
  app.replaceChildren(...nodes.filter((n) => n !== null && n !== undefined && n !== false));
}

function showError(err) {
  app.replaceChildren(h("p.error", { id: "error" }, String(err.message || err)));
}

// ---- runs ------------------------------------------------------------------------------------

async function showRuns() {
  setCrumbs(["Runs", "#/"]);
  const data = await api("/api/runs");
  const rows = data.runs.map((r) =>
    h("tr", { "data-run": r.run_id },
      h("td", {}, h("a", { href: "#/run/" + enc(r.run_id) }, r.run_id)),
      h("td", {}, r.create_time),
      h("td", {}, r.manifest ? r.manifest.harness : "–"),
      h("td", {}, r.manifest ? r.manifest.model : "–"),
      h("td.num", {}, `${r.finished_rollouts} / ${r.rollouts}`),
      h("td.num", {}, fmt(r.mean_reward)),
      h("td.num", {}, r.steps),
      h("td.num", {}, r.last_policy_version)));
  render(
    h("h1", {}, "Runs"),
    data.runs.length
      ? h("table", { id: "runs" },
          h("thead", {}, h("tr", {}, ...["run", "first seen", "harness", "model"].map((t) => h("th", {}, t)),
            ...["finished / rollouts", "mean reward", "steps", "policy version"].map((t) => h("th.num", {}, t)))),
          h("tbody", {}, rows))
      : h("p.muted", {}, "No runs in the store yet."));
}

// ---- one run: manifest, curves, rollouts -------------------------------------------------------

function manifestView(m) {
  if (!m) return h("p.muted", {}, "This run was never registered (no RunRegistered event): no manifest.");
  const items = [];
  for (const [k, v] of Object.entries(m)) {
    const shown = typeof v === "object" && v !== null ? JSON.stringify(v) : String(v);
    items.push(h("dt", {}, k), h("dd", { "data-field": k }, shown === "" ? "–" : shown));
  }
  return h("dl.kv", { id: "manifest" }, items);
}

// One SVG line chart of a metric over steps: a polyline and one circle.pt per step; `marks` are
// extra points drawn apart (circle.eval: the held-out evaluations before and after RL).
// A line chart: each series {label, points: [{x, y}]} one polyline (dots: a circle per point), the
// marks (held-out evaluations) circled; several series get a legend.
function curve(name, series, { marks = [], xLabel = "step", dots = true, id = "curve-" + slug(name) } = {}) {
  const W = 420, H = 200, L = 48, R = 12, T = 10, B = 28;
  const all = series.flatMap((sr) => sr.points).concat(marks);
  const xs = all.map((p) => p.x), ys = all.map((p) => p.y);
  let [x0, x1] = [Math.min(...xs), Math.max(...xs)];
  let [y0, y1] = [Math.min(...ys), Math.max(...ys)];
  if (x0 === x1) { x0 -= 1; x1 += 1; }
  if (y0 === y1) { y0 -= 0.5; y1 += 0.5; }
  const px = (x) => L + ((x - x0) / (x1 - x0)) * (W - L - R);
  const py = (y) => H - B - ((y - y0) / (y1 - y0)) * (H - T - B);
  const svg = s("svg", { class: "curve", id, "data-metric": name,
    viewBox: `0 0 ${W} ${H}`, width: W, height: H, role: "img", "aria-label": `${name} per ${xLabel}` });
  for (const f of [0, 0.5, 1]) {
    const y = y0 + f * (y1 - y0);
    svg.append(s("line", { class: "grid", x1: L, x2: W - R, y1: py(y), y2: py(y) }));
    svg.append(s("text", { x: L - 4, y: py(y) + 3, "text-anchor": "end" }, fmt(y, 3)));
  }
  svg.append(s("line", { class: "axis", x1: L, x2: W - R, y1: H - B, y2: H - B }));
  svg.append(s("line", { class: "axis", x1: L, x2: L, y1: T, y2: H - B }));
  svg.append(s("text", { x: L, y: H - 8 }, `${xLabel} ${fmt(x0)}`));
  svg.append(s("text", { x: W - R, y: H - 8, "text-anchor": "end" }, `${xLabel} ${fmt(x1)}`));
  series.forEach((sr, i) => {
    svg.append(s("polyline", { class: `line s${i % 6}`, "data-series": sr.label, "data-points": sr.points.length,
      points: sr.points.map((p) => `${px(p.x)},${py(p.y)}`).join(" ") }));
    if (!dots) return;
    for (const p of sr.points) {
      svg.append(s("circle", { class: "pt", cx: px(p.x), cy: py(p.y), r: 3, "data-step": p.x, "data-value": p.y },
        s("title", {}, `${xLabel} ${p.x}: ${p.y}`)));
    }
  });
  for (const m of marks) {
    svg.append(s("circle", { class: "eval", cx: px(m.x), cy: py(m.y), r: 5, "data-label": m.label, "data-value": m.y },
      s("title", {}, `${m.label} (held-out eval): ${fmt(m.y, 3)}`)));
  }
  const legend = marks.map((m) => `${m.label}: ${fmt(m.y, 3)}`).join(", ");
  return h("div.curve-box", {}, h("h3", {}, name), svg,
    series.length > 1
      ? h("p.series-legend", {}, series.map((sr, i) => h(`span.key.s${i % 6}`, { "data-series": sr.label }, "― " + sr.label)))
      : null,
    legend ? h("p.muted.eval-legend", {}, "◆ held-out eval " + legend) : null);
}

// Resource use over the run's time (`openforge dash --state-dir`: the run's resources.jsonl):
// cores busy and memory in use, the machine's and each service's.
function resourcesView(r) {
  if (!r.cpu.length) return null;
  const pts = (series) => series.map((sr) => ({ label: sr.label, points: sr.points.map(([x, y]) => ({ x, y })) }));
  return h("div.curves", { id: "resources" },
    curve(`CPU (cores busy of ${r.cores})`, pts(r.cpu), { xLabel: "min", dots: false, id: "curve-cpu" }),
    curve(`memory (GiB of ${r.memory_total_gib})`, pts(r.memory), { xLabel: "min", dots: false, id: "curve-memory" }));
}

function curvesView(metrics) {
  if (!metrics.steps.length) return h("p.muted", { id: "no-curves" }, "No training steps recorded for this run yet.");
  // Reward curves first, then the rest in name order.
  const names = [...metrics.metric_names].sort((a, b) =>
    (b.startsWith("reward") - a.startsWith("reward")) || a.localeCompare(b));
  // The held-out evaluations around the RL run: before at step 0, after at the last step.
  const last = Math.max(...metrics.steps.map((st) => st.step));
  const marks = (metrics.evals || []).map((e) => ({ x: e.key === "before" ? 0 : last, y: e.reward, label: e.label }));
  const boxes = names.map((name) => {
    const pts = metrics.steps.filter((st) => name in st.metrics).map((st) => ({ x: st.step, y: st.metrics[name] }));
    return curve(name, [{ label: name, points: pts }], { marks: name === "reward/mean" ? marks : [] });
  });
  return h("div.curves", { id: "curves" }, boxes);
}

function rolloutRow(r) {
  return h("tr", { "data-rollout": r.rollout_id, "data-status": r.status },
    h("td", {}, h("a", { href: "#/rollout/" + enc(r.rollout_id) }, r.rollout_id)),
    h("td", {}, r.task_id),
    h("td", {}, `${r.group_id} #${r.group_index}`),
    h("td", {}, r.harness),
    h("td", {}, statusCell(r.status)),
    h("td.num", {}, fmt(r.reward)),
    h("td.num", {}, r.duration_s === null ? "–" : r.duration_s.toFixed(1) + " s"),
    h("td", {}, r.failure_reason));
}

// Rollouts by status, and the failures by cause (a link filters the table to that status).
function outcomesView(runId, o) {
  const statuses = Object.entries(o.statuses);
  if (!statuses.length) return h("p.muted", { id: "outcomes" }, "No rollouts yet.");
  const total = statuses.reduce((n, [, k]) => n + k, 0);
  return h("div.card", { id: "outcomes" },
    h("p", { id: "outcome-statuses" }, statuses.map(([st, n]) =>
      h("span.outcome", { "data-status": st, "data-count": String(n) },
        statusCell(st), ` ${n} (${Math.round((100 * n) / total)}%)`))),
    o.causes.length
      ? h("table", { id: "failure-causes" },
        h("thead", {}, h("tr", {}, h("th", {}, "status"), h("th.num", {}, "rollouts"), h("th", {}, "cause"),
          h("th", {}, "example"))),
        h("tbody", {}, o.causes.map((c) => h("tr", { "data-status": c.status, "data-count": String(c.rollouts) },
          h("td", {}, h("a", { href: `#/run/${enc(runId)}?status=${c.status}` }, statusCell(c.status))),
          h("td.num", {}, String(c.rollouts)),
          h("td.cause", {}, c.cause),
          h("td", {}, h("a", { href: "#/rollout/" + enc(c.example) }, c.example))))))
      : h("p.muted", {}, "No failures."));
}

// The run's rollouts per harness (an `openforge eval --harness a,b,...` comparison), when it used
// more than one.
function harnessesView(o) {
  if (!o.harnesses || o.harnesses.length < 2) return null;
  const pct = (n, d) => (d ? `${n} (${Math.round((100 * n) / d)}%)` : "–");
  return h("table", { id: "harnesses" },
    h("thead", {}, h("tr", {}, h("th", {}, "harness"), h("th.num", {}, "rollouts"), h("th.num", {}, "mean reward"),
      h("th.num", {}, "passed"), h("th.num", {}, "mean duration"), h("th.num", {}, "peak sandbox memory"),
      h("th.num", {}, "turns"), h("th.num", {}, "tokens"), h("th.num", {}, "samples"), h("th", {}, "statuses"))),
    h("tbody", {}, o.harnesses.map((x) => h("tr", { "data-harness": x.harness, "data-rollouts": String(x.rollouts) },
      h("td", {}, x.harness),
      h("td.num", {}, String(x.rollouts)),
      h("td.num", {}, fmt(x.reward_mean)),
      h("td.num", {}, pct(x.passed, x.rollouts)),
      h("td.num", {}, x.mean_s === null ? "–" : x.mean_s.toFixed(1) + " s"),
      h("td.num", {}, x.peak_mib === null ? "–" : x.peak_mib.toFixed(0) + " MiB"),
      h("td.num", {}, x.turns === null ? "–" : x.turns.toFixed(1)),
      h("td.num", {}, x.tokens === null ? "–" : x.tokens.toFixed(0)),
      h("td.num", {}, x.samples === null ? "–" : x.samples.toFixed(2)),
      h("td", {}, Object.entries(x.statuses).map(([st, n]) => h("span.outcome", {}, statusCell(st), ` ${n} `)))))));
}

async function showRun(runId, query) {
  setCrumbs(["Runs", "#/"], [runId, "#/run/" + enc(runId)]);
  const [{ run }, metrics, outcomes, resources] = await Promise.all([
    api("/api/runs/" + enc(runId)),
    api(`/api/runs/${enc(runId)}/metrics`),
    api(`/api/runs/${enc(runId)}/outcomes`),
    api("/api/resources"),
  ]);
  const f = { task: query.get("task") || "", status: query.get("status") || "",
    min_reward: query.get("min_reward") || "", max_reward: query.get("max_reward") || "" };
  const tbody = h("tbody", {});
  const more = h("button", { type: "button", id: "more", hidden: true }, "Load more");
  const count = h("span.muted", { id: "rollout-count" });
  const tasks = h("datalist", { id: "task-list" });
  let token = "";
  const seenTasks = new Set();
  async function load(reset) {
    if (reset) { tbody.replaceChildren(); token = ""; }
    const params = new URLSearchParams({ ...f, page_size: "50" });
    if (token) params.set("page_token", token);
    const data = await api(`/api/runs/${enc(runId)}/rollouts?${params}`);
    tbody.append(...data.rollouts.map(rolloutRow));
    for (const r of data.rollouts) {
      if (!seenTasks.has(r.task_id)) { seenTasks.add(r.task_id); tasks.append(h("option", { value: r.task_id })); }
    }
    token = data.next_page_token;
    more.hidden = !token;
    count.textContent = `${tbody.children.length} shown`;
  }
  more.addEventListener("click", () => load(false).catch(showError));
  const form = h("form.filters", { id: "filters" },
    h("label", {}, "task", h("input", { name: "task", list: "task-list", value: f.task, placeholder: "any" })),
    h("label", {}, "status", h("select", { name: "status" }, h("option", { value: "" }, "any"),
      STATUSES.map((st) => h("option", { value: st, selected: st === f.status }, st)))),
    h("label", {}, "reward ≥", h("input", { name: "min_reward", type: "number", step: "any", value: f.min_reward })),
    h("label", {}, "reward ≤", h("input", { name: "max_reward", type: "number", step: "any", value: f.max_reward })),
    h("button", { type: "submit" }, "Filter"), tasks, count);
  form.addEventListener("submit", (ev) => {
    ev.preventDefault();
    const params = new URLSearchParams();
    for (const k of Object.keys(f)) {
      const v = form.elements[k].value.trim();
      if (v) params.set(k, v);
    }
    location.hash = `#/run/${enc(runId)}` + (params.toString() ? "?" + params : "");
  });
  const m = run.manifest;
  const harnesses = harnessesView(outcomes);
  const machine = resourcesView(resources);
  render(
    h("h1", {}, "Run ", h("code", {}, run.run_id)),
    h("div.card", {},
      h("dl.kv", { id: "run-summary" },
        h("dt", {}, "rollouts"), h("dd", {}, `${run.finished_rollouts} finished of ${run.rollouts}, ${run.tasks} task(s)`),
        h("dt", {}, "mean reward"), h("dd", {}, fmt(run.mean_reward)),
        h("dt", {}, "training steps"), h("dd", {}, `${run.steps} (policy version ${run.last_policy_version})`),
        h("dt", {}, "first seen"), h("dd", {}, run.create_time))),
    h("h2", {}, "Manifest"), h("div.card", {}, manifestView(m)),
    h("h2", {}, "Metrics per step"), curvesView(metrics),
    machine && h("h2", {}, "Resources over time"), machine,
    h("h2", {}, "Outcomes"), outcomesView(runId, outcomes),
    harnesses && h("h2", {}, "Harnesses"), harnesses,
    h("h2", {}, "Rollouts"), form,
    h("table", { id: "rollouts" },
      h("thead", {}, h("tr", {}, ...["rollout", "task", "group", "harness", "status"].map((t) => h("th", {}, t)),
        h("th.num", {}, "reward"), h("th.num", {}, "duration"), h("th", {}, "failure"))),
      tbody),
    more);
  await load(true);
}

// ---- one rollout: the trajectory ----------------------------------------------------------------

function bodyView(body, label) {
  if (!body || body.bytes === 0) return h("p.muted", {}, `no ${label} recorded`);
  const text = body.json !== null ? JSON.stringify(body.json, null, 2) : body.text;
  return h("div", {},
    h("div.muted", {}, `${label}: ${body.bytes} bytes${body.truncated ? " (cut)" : ""}`),
    h("pre", { class: label.replace(/\s+/g, "-") }, text));
}

function spliceView(sp) {
  const spans = (list) => list.map((x) => `[${x.start}, ${x.end})${x.source_call_id ? " from " + x.source_call_id : ""}`).join(", ") || "–";
  return h("dl.kv.splice", {},
    h("dt", {}, "break cause"), h("dd", { class: "break-cause" }, sp.break_cause),
    h("dt", {}, "detail"), h("dd", {}, sp.break_detail || "–"),
    h("dt", {}, "extends call"), h("dd", {}, sp.extends_call_id || "–"),
    h("dt", {}, "reused spans"), h("dd", {}, spans(sp.reused)),
    h("dt", {}, "rendered spans"), h("dd", {}, spans(sp.rendered)),
    h("dt", {}, "notes"), h("dd", {}, sp.notes.join("; ") || "–"));
}

function callView(c, i) {
  const broke = c.splice.break_cause !== "NONE" && c.splice.break_cause !== "UNSPECIFIED";
  const answer = c.completion_text !== null
    ? h("pre.answer", {}, c.completion_text)
    : h("pre.answer.ids", {}, c.completion_token_ids.join(" "));
  return h("details.call", { "data-call": c.call_id, "data-attempt": c.attempt, open: i === 0 },
    h("summary", {},
      h("strong", {}, `${i + 1}. ${c.call_id}`), c.attempt > 1 ? ` (attempt ${c.attempt})` : "",
      h("span.badge", {}, c.wire_api), h("span.badge", {}, `HTTP ${c.http_status}`),
      h("span.badge", {}, `${c.prompt_tokens} prompt → ${c.completion_token_ids.length} sampled`),
      h("span.badge", {}, c.finish_reason),
      broke ? h("span.badge.break", {}, "break: " + c.splice.break_cause) : null),
    h("div.muted", {}, `model ${c.model || "–"} · ${c.stream ? "streamed" : "not streamed"} · received ${c.receive_time}` +
      ` · first byte ${c.time_to_first_byte_s.toFixed(3)} s · total ${c.total_time_s.toFixed(3)} s` +
      ` · policy version ${c.policy_versions.join(", ") || "–"}`),
    h("div.cols", {},
      h("div", {}, h("h3", {}, "Harness request"), bodyView(c.request, "request body")),
      h("div", {}, h("h3", {}, "Model answer (sampled tokens)"), answer,
        h("h3", {}, "Sent to the harness"), bodyView(c.response, "response body"))),
    h("h3", {}, "Splice report"), spliceView(c.splice));
}

function tokenSpans(ids, texts, cls, mask, logprobs, versions) {
  const out = [];
  for (let k = 0; k < ids.length; k++) {
    const m = mask ? mask[k] : null;
    const classes = ["tok", m === null ? cls : "mask-" + m];
    let label = texts ? texts[k] : String(ids[k]);
    if (!texts) classes.push("id");
    if (texts && label === "") label = "∅";
    let title = `id ${ids[k]}`;
    if (m !== null) title += m ? ` · trained · logprob ${logprobs[k]} · policy v${versions[k]}` : " · harness/tool (not trained)";
    out.push(h("span", { class: classes.join(" "), title }, label));
  }
  return out;
}

function sampleView(smp) {
  return h("div.card.sample", { "data-sample": smp.sample_id },
    h("div", {}, h("strong", {}, `Sample ${smp.index}`),
      h("span.badge.sample-break" + (smp.break_cause === "NONE" ? "" : ".break"), {},
        smp.break_cause === "NONE" ? "first sample" : "fork: " + smp.break_cause),
      smp.partial ? h("span.badge.break", {}, "partial") : null,
      h("span.badge", {}, `reward ${fmt(smp.reward)}`),
      h("span.badge", {}, `${smp.prompt_ids.length} prompt + ${smp.response_ids.length} response tokens, ${smp.trained_tokens} trained`)),
    smp.break_detail ? h("div.muted", {}, "fork detail: " + smp.break_detail) : null,
    h("div.muted", {}, "calls: " + smp.call_ids.join(", ")),
    h("div.tokens", {},
      tokenSpans(smp.prompt_ids, smp.prompt_text, "prompt", null),
      tokenSpans(smp.response_ids, smp.response_text, null, smp.loss_mask, smp.logprobs, smp.policy_versions)));
}

async function showRollout(rolloutId) {
  const data = await api("/api/rollouts/" + enc(rolloutId));
  const r = data.rollout;
  setCrumbs(["Runs", "#/"], [r.run_id, "#/run/" + enc(r.run_id)], [rolloutId, null]);
  const tk = data.tokenizer;
  const tokNote = tk.model_dir
    ? `tokens decoded with ${tk.model_dir} (${tk.source})` +
      (tk.matches_manifest === false ? " — WARNING: its tokenizer.json differs from the run's manifest hash" : "")
    : "no tokenizer (start the dashboard with --model-dir): token ids shown";
  render(
    h("h1", {}, "Rollout ", h("code", {}, r.rollout_id)),
    h("div.card", {}, h("dl.kv", { id: "rollout-summary" },
      h("dt", {}, "status"), h("dd", {}, statusCell(r.status)),
      h("dt", {}, "reward"), h("dd", { id: "reward" }, fmt(r.reward)),
      h("dt", {}, "task"), h("dd", {}, r.task_id),
      h("dt", {}, "group"), h("dd", {}, `${r.group_id} #${r.group_index}`),
      h("dt", {}, "harness"), h("dd", {}, r.harness),
      h("dt", {}, "started / ended"), h("dd", {}, `${r.start_time || "–"} / ${r.end_time || "–"}`),
      h("dt", {}, "sandbox CPU / peak memory"), h("dd", { id: "sandbox-usage" },
        `${r.sandbox_cpu_s === null ? "–" : r.sandbox_cpu_s.toFixed(1) + " s"} / ` +
        `${r.sandbox_peak_mib === null ? "–" : r.sandbox_peak_mib.toFixed(0) + " MiB"}`),
      h("dt", {}, "failure"), h("dd", {}, r.failure_reason || "–"))),
    h("h2", {}, "Verifier output"),
    r.verifier_output ? h("pre", { id: "verifier" }, r.verifier_output) : h("p.muted", { id: "verifier" }, "none recorded"),
    h("h2", {}, `Calls (${data.calls.length})`),
    h("div", { id: "calls" }, data.calls.map(callView)),
    h("h2", {}, `Samples (${data.samples.length})`),
    h("p.muted", { id: "tokenizer-note" }, tokNote),
    h("p.legend", {}, h("span.tok.prompt", {}, "prompt"), h("span.tok.mask-1", {}, "sampled by the policy (loss mask 1)"),
      h("span.tok.mask-0", {}, "harness / tool tokens (loss mask 0)")),
    data.samples_note ? h("p.muted", {}, data.samples_note) : null,
    h("div", { id: "samples" }, data.samples.map(sampleView)));
}

// ---- routing ---------------------------------------------------------------------------------

async function route() {
  const hash = location.hash.replace(/^#/, "") || "/";
  const [path, qs] = hash.split("?");
  const parts = path.split("/").filter(Boolean).map(decodeURIComponent);
  app.replaceChildren(h("p.muted", {}, "Loading…"));
  try {
    if (parts[0] === "run" && parts[1]) await showRun(parts[1], new URLSearchParams(qs || ""));
    else if (parts[0] === "rollout" && parts[1]) await showRollout(parts[1]);
    else await showRuns();
    document.body.dataset.ready = "1";
  } catch (err) {
    showError(err);
    document.body.dataset.ready = "error";
  }
}

window.addEventListener("hashchange", route);
route();
