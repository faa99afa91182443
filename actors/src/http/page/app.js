// Tidemark's job page: polls the Flink-compatible REST API of the same
// origin every second and draws the job with each vertex's watermark, its
// throughput and backpressure since the start (computed here from the
// deltas of the counters' history the server keeps, so that a page opened
// late still shows the past), its checkpoints and, for one checkpoint,
// every subtask's acknowledgement with the one that came last.
"use strict";

(function () {
  const POLL_MS = 1000;
  const PALETTE = ["#2f6fd6", "#e07b12", "#2b9a5a", "#c2417a", "#7a52c7", "#0f9aa8", "#8c6b1f", "#d23f3f"];
  // The phases of a subtask's checkpoint, in the order of the table's columns (from column 4).
  const PHASES = [
    ["start delay", (s) => s.start_delay],
    ["alignment", (s) => s.alignment && s.alignment.duration],
    ["sync", (s) => s.checkpoint && s.checkpoint.sync],
    ["async", (s) => s.checkpoint && s.checkpoint.async],
  ];
  const FIRST_PHASE_COLUMN = 4;

  const requestedJob = new URLSearchParams(location.search).get("job");
  const state = {
    jid: requestedJob,
    job: null,
    vertexNames: new Map(), // vertex id -> name
    history: null, // the server's samples of the counters since the job started
    watermarks: new Map(), // vertex id -> the least currentInputWatermark of its subtasks, as Flink writes it
    checkpoints: null,
    selected: null, // the checkpoint id shown in the subtask table
    pinned: false, // true once the user chose a checkpoint
    details: new Map(), // checkpoint id -> {entry, tasks: [{id, stats}], final}
    errors: new Map(), // what failed in the latest poll, by source
  };

  // ---- Fetching -----------------------------------------------------------

  async function getJSON(path) {
    const abort = new AbortController();
    const timer = setTimeout(() => abort.abort(), 5000);
    try {
      const response = await fetch(path, { signal: abort.signal, cache: "no-store" });
      if (!response.ok) {
        const error = new Error(`${path}: HTTP ${response.status}`);
        error.status = response.status;
        throw error;
      }
      return await response.json();
    } catch (e) {
      if (e.name === "AbortError") throw new Error(`${path}: no answer within 5 s`);
      if (e instanceof TypeError) throw new Error(`${path}: the server cannot be reached`);
      throw e;
    } finally {
      clearTimeout(timer);
    }
  }

  async function attempt(what, action) {
    try {
      await action();
      state.errors.delete(what);
    } catch (e) {
      state.errors.set(what, e.message || String(e));
      if (what === "job" && e.status === 404 && !requestedJob) state.jid = null; // the job is gone: look again
    }
  }

  async function tick() {
    if (!state.jid) {
      await attempt("jobs", async () => {
        const overview = await getJSON("jobs/overview");
        const first = (overview.jobs || [])[0];
        if (first) state.jid = first.jid;
      });
    }
    if (state.jid) {
      const jid = state.jid;
      await Promise.all([
        attempt("job", async () => onJob(await getJSON(`jobs/${jid}`))),
        attempt("history", async () => { state.history = await getJSON(`jobs/${jid}/history`); }),
        attempt("checkpoints", async () => onCheckpoints(await getJSON(`jobs/${jid}/checkpoints`))),
      ]);
      await attempt("watermarks", loadWatermarks);
      await attempt("details", loadSelected);
    }
    render();
    setTimeout(tick, POLL_MS);
  }

  function onJob(job) {
    if (state.job && state.job.jid !== job.jid) {
      // Another job: nothing of the previous one applies.
      Object.assign(state, { history: null, checkpoints: null, selected: null, pinned: false });
      state.watermarks.clear();
      state.details.clear();
    }
    state.job = job;
    for (const v of job.vertices || []) state.vertexNames.set(v.id, v.name);
  }

  // Turns the history's cumulative counters into rates, one sample per delta: the
  // sources' records out per second and each vertex's backpressured ms per second (null
  // where a counter went down); `rates` holds each vertex's of the latest delta.
  function series() {
    const history = state.history || {};
    const ids = history.vertices || [];
    const points = history.samples || [];
    const sources = new Set(sourceIds(state.job));
    const samples = [];
    const rates = new Map();
    for (let k = 1; k < points.length; k += 1) {
      const before = points[k - 1], now = points[k];
      const seconds = (now.time - before.time) / 1000;
      if (!(seconds > 0)) continue;
      const rate = (field, i) => (now[field][i] >= before[field][i] ? (now[field][i] - before[field][i]) / seconds : null);
      const sample = { t: now.time, throughput: 0, bp: {} };
      ids.forEach((id, i) => {
        const out = rate("write-records", i), bp = rate("accumulated-backpressured-time", i);
        if (sources.has(id)) sample.throughput = out === null || sample.throughput === null ? null : sample.throughput + out;
        sample.bp[id] = bp;
        rates.set(id, { out, bp });
      });
      samples.push(sample);
    }
    return { since: points.length ? points[0].time : null, samples, rates };
  }

  // The vertices whose output is the job's input.
  function sourceIds(job) {
    return ((job && job.vertices) || []).filter((v) => v.source).map((v) => v.id);
  }

  // Each vertex's watermark, as Flink's UI shows it: the least of its subtasks'. A source
  // has none (no input), and is not asked.
  async function loadWatermarks() {
    const jid = state.jid;
    const vertices = ((state.job && state.job.vertices) || []).filter((v) => !v.source);
    const all = await Promise.all(vertices.map((v) => getJSON(`jobs/${jid}/vertices/${v.id}/watermarks`)));
    vertices.forEach((v, i) => {
      const values = all[i].map((m) => m.value);
      const least = values.reduce((a, b) => (a === null || BigInt(b) < BigInt(a) ? b : a), null);
      state.watermarks.set(v.id, least);
    });
  }

  function onCheckpoints(checkpoints) {
    state.checkpoints = checkpoints;
    if (!state.pinned) {
      const newest = newestCompleted(checkpoints);
      if (newest !== null) state.selected = newest;
    }
    const keep = new Set((checkpoints.history || []).map((c) => c.id));
    for (const id of state.details.keys()) if (!keep.has(id) && id !== state.selected) state.details.delete(id);
  }

  function newestCompleted(checkpoints) {
    let newest = null;
    const latest = checkpoints.latest && checkpoints.latest.completed;
    if (latest) newest = latest.id;
    for (const c of checkpoints.history || []) {
      if (c.status === "COMPLETED" && (newest === null || c.id > newest)) newest = c.id;
    }
    return newest;
  }

  // Fetches the selected checkpoint's details and every vertex's subtasks; a finished
  // checkpoint's are kept, an in-progress one's are fetched again on every poll.
  async function loadSelected() {
    const id = state.selected;
    const jid = state.jid;
    if (id === null || !jid) return;
    const known = state.details.get(id);
    if (known && known.final) return;
    const entry = await getJSON(`jobs/${jid}/checkpoints/details/${id}`);
    const order = (state.job && state.job.vertices ? state.job.vertices : []).map((v) => v.id);
    const ids = Object.keys(entry.tasks || {}).sort((a, b) => rank(order, a) - rank(order, b));
    const stats = await Promise.all(ids.map((v) => getJSON(`jobs/${jid}/checkpoints/details/${id}/subtasks/${v}`)));
    state.details.set(id, {
      entry,
      tasks: ids.map((v, i) => ({ id: v, stats: stats[i] })),
      final: entry.status !== "IN_PROGRESS",
    });
  }

  function rank(order, id) {
    const i = order.indexOf(id);
    return i < 0 ? order.length : i;
  }

  function select(id, pinned) {
    state.selected = id;
    state.pinned = pinned;
    render();
    attempt("details", loadSelected).then(render);
  }

  // ---- Formatting ---------------------------------------------------------

  const isNumber = (n) => typeof n === "number" && isFinite(n);
  const fmtInt = (n) => (isNumber(n) ? Math.round(n).toLocaleString("en-US") : "—");
  const fmtMs = (ms) => (isNumber(ms) && ms >= 0 ? `${fmtInt(ms)} ms` : "—");

  function fmtBytes(n) {
    if (!isNumber(n) || n < 0) return "—";
    const units = ["B", "KiB", "MiB", "GiB", "TiB"];
    let i = 0;
    while (n >= 1024 && i < units.length - 1) {
      n /= 1024;
      i += 1;
    }
    return i === 0 ? `${n} B` : `${n.toFixed(n < 10 ? 2 : 1)} ${units[i]}`;
  }

  function fmtRate(n) {
    if (!isNumber(n)) return "—";
    if (n >= 1e6) return `${(n / 1e6).toFixed(2)} M`;
    if (n >= 1e4) return `${(n / 1e3).toFixed(1)} k`;
    return n >= 100 ? fmtInt(n) : n.toFixed(n >= 10 ? 1 : 2).replace(/\.?0+$/, "") || "0";
  }

  function fmtDuration(ms) {
    if (!isNumber(ms) || ms < 0) return "—";
    const s = Math.floor(ms / 1000);
    const parts = [
      [Math.floor(s / 86400), "d"], [Math.floor(s / 3600) % 24, "h"], [Math.floor(s / 60) % 60, "min"], [s % 60, "s"],
    ];
    const first = parts.findIndex(([n]) => n > 0);
    return first < 0 ? `${ms} ms` : parts.slice(first, first + 2).map(([n, u]) => `${n} ${u}`).join(" ");
  }

  function fmtTime(ms) {
    if (!isNumber(ms) || ms <= 0) return "—";
    const d = new Date(ms);
    const p = (n, w = 2) => String(n).padStart(w, "0");
    return `${p(d.getHours())}:${p(d.getMinutes())}:${p(d.getSeconds())}.${p(d.getMilliseconds(), 3)}`;
  }

  // ---- DOM helpers --------------------------------------------------------

  function el(tag, attributes, ...children) {
    const node = document.createElement(tag);
    for (const [k, v] of Object.entries(attributes || {})) {
      if (v !== null && v !== undefined && v !== false) node.setAttribute(k, v);
    }
    for (const child of children) {
      if (child !== null && child !== undefined) node.append(child instanceof Node ? child : String(child));
    }
    return node;
  }

  function svg(tag, attributes, text) {
    const node = document.createElementNS("http://www.w3.org/2000/svg", tag);
    for (const [k, v] of Object.entries(attributes || {})) node.setAttribute(k, v);
    if (text !== undefined) node.textContent = text;
    return node;
  }

  const $ = (id) => document.getElementById(id);
  const swatch = (color) => el("span", { class: "swatch", style: `background:${color}` });
  const num = (text, cls) => el("td", { class: cls ? `num ${cls}` : "num" }, text);

  // ---- Rendering ----------------------------------------------------------

  function render() {
    const errors = [...state.errors.values()];
    $("error").hidden = errors.length === 0;
    $("error").textContent = errors.length ? `Cannot update the page (retrying every second): ${errors.join("; ")}` : "";
    const charted = series();
    renderJob(charted.rates);
    renderCharts(charted);
    renderCheckpoints();
    renderSelected();
  }

  function renderJob(rates) {
    const job = state.job;
    if (!job) {
      $("job-name").textContent = state.jid ? "Loading the job…" : "No job is running yet";
      return;
    }
    document.title = `${job.name} · Tidemark`;
    $("job-name").textContent = job.name;
    $("job-state").textContent = job.state;
    $("job-state").className = `state ${String(job.state).toLowerCase()}`;
    $("job-duration").textContent = fmtDuration(job.duration);
    $("job-start").textContent = fmtTime(job["start-time"]);
    $("job-id").textContent = job.jid;
    $("vertices").replaceChildren(
      ...(job.vertices || []).map((v, i) => {
        const m = v.metrics || {};
        const rate = rates.get(v.id) || {};
        const bp = isNumber(rate.bp) ? `${fmtInt(rate.bp)} ms/s` : "—";
        return el("tr", { "data-vertex-id": v.id },
          el("td", null, swatch(PALETTE[i % PALETTE.length]), v.name),
          el("td", null, el("span", { class: `state ${String(v.status).toLowerCase()}` }, v.status)),
          num(v.parallelism), num(fmtInt(m["read-records"])), num(fmtInt(m["write-records"])), num(fmtRate(rate.out)), num(bp),
          watermarkCell(v));
      }));
  }

  // Flink writes Long.MIN_VALUE before the first watermark and Long.MAX_VALUE after the
  // last; event time that reads as a date since 2001 is shown as a time of day.
  function watermarkCell(vertex) {
    if (vertex.source) return el("td", { class: "num", title: "a source has no input watermark" }, "—");
    const value = state.watermarks.get(vertex.id);
    if (value === undefined || value === null) return num("—");
    const ms = BigInt(value);
    const text = ms === -(2n ** 63n) ? "none yet" : ms === 2n ** 63n - 1n ? "end of input"
      : ms >= 1000000000000n ? fmtTime(Number(ms)) : `${fmtInt(Number(ms))} ms`;
    return el("td", { class: "num", "data-watermark": value, title: `${value} ms` }, text);
  }

  function renderCharts({ since, samples }) {
    const latest = samples[samples.length - 1];
    $("throughput-now").textContent = latest && isNumber(latest.throughput) ? `${fmtRate(latest.throughput)} records/s` : "";
    lineChart($("throughput-chart"), $("throughput-legend"), since, samples,
      [{ name: "sources, records/s", color: PALETTE[0], value: (s) => s.throughput }], fmtRate);
    const vertices = state.job ? state.job.vertices || [] : [];
    lineChart($("backpressure-chart"), $("backpressure-legend"), since, samples,
      vertices.map((v, i) => ({ name: v.name, color: PALETTE[i % PALETTE.length], value: (s) => s.bp[v.id] })),
      (n) => `${fmtInt(n)} ms/s`);
  }

  // Draws lines of `series` over `samples`, from `since` (the history's start) to the newest;
  // a null value breaks a line. `data-span-ms` says how long the time axis spans.
  function lineChart(chart, legend, since, samples, series, format) {
    const W = widthOf(chart, 600), H = 190, right = 12, top = 10, bottom = 22;
    chart.setAttribute("viewBox", `0 0 ${W} ${H}`);
    const nodes = [];
    legend.replaceChildren(...series.map((s) => el("span", null, swatch(s.color), s.name)));
    if (samples.length < 2) {
      chart.removeAttribute("data-span-ms");
      chart.replaceChildren(svg("text", { x: W / 2, y: H / 2, "text-anchor": "middle", class: "empty" }, "waiting for data…"));
      return;
    }
    let max = 0;
    for (const s of series) for (const p of samples) if (isNumber(s.value(p))) max = Math.max(max, s.value(p));
    max = niceCeiling(max);
    const ticks = [0, 0.5, 1].map((f) => [max * f, format(max * f)]);
    const left = 14 + 6.5 * Math.max(...ticks.map(([, label]) => label.length)); // room for the longest label
    const t0 = since, t1 = samples[samples.length - 1].t;
    chart.setAttribute("data-span-ms", t1 - t0);
    const x = (t) => left + ((t - t0) / Math.max(1, t1 - t0)) * (W - left - right);
    const y = (v) => top + (1 - v / max) * (H - top - bottom);
    for (const [value, label] of ticks) {
      nodes.push(svg("line", { x1: left, x2: W - right, y1: y(value), y2: y(value), class: "grid" }));
      nodes.push(svg("text", { x: left - 6, y: y(value) + 4, "text-anchor": "end", class: "axis" }, label));
    }
    nodes.push(svg("text", { x: left, y: H - 5, class: "axis" }, `−${fmtDuration(t1 - t0)}`));
    nodes.push(svg("text", { x: W - right, y: H - 5, "text-anchor": "end", class: "axis" }, "now"));
    for (const s of series) {
      let d = "", pen = "M";
      for (const p of samples) {
        const v = s.value(p);
        if (!isNumber(v)) { pen = "M"; continue; }
        d += `${pen}${x(p.t).toFixed(1)},${y(v).toFixed(1)} `;
        pen = "L";
      }
      if (d) nodes.push(svg("path", { d, class: "line", stroke: s.color }));
    }
    chart.replaceChildren(...nodes);
  }

  // The drawing's width in CSS pixels, so that its text is never stretched.
  function widthOf(node, fallback) {
    const width = Math.round(node.getBoundingClientRect().width);
    return width > 0 ? width : fallback;
  }

  function niceCeiling(n) {
    if (!(n > 0)) return 1;
    const magnitude = Math.pow(10, Math.floor(Math.log10(n)));
    for (const step of [1, 2, 2.5, 5, 10]) if (n <= step * magnitude) return step * magnitude;
    return 10 * magnitude;
  }

  function renderCheckpoints() {
    const cps = state.checkpoints;
    if (!cps) return;
    const counts = cps.counts || {};
    $("checkpoint-counts").replaceChildren(
      ...[["completed", "completed"], ["in_progress", "in progress"], ["failed", "failed"], ["restored", "restored"],
        ["total", "total"]].map(([k, label]) => el("span", { class: `count ${k}` }, el("b", null, fmtInt(counts[k])), ` ${label}`)));
    const summary = cps.summary || {};
    const item = (label, text) => el("span", null, el("b", null, label), text);
    const line = (label, stats, f) =>
      stats ? item(label, ` min ${f(stats.min)} · avg ${f(stats.avg)} · p99 ${f(stats.p99)} · max ${f(stats.max)}`) : null;
    const restored = cps.latest && cps.latest.restored;
    const restoredFrom = restored
      ? ` ${restored.is_savepoint ? "savepoint" : "checkpoint"} ${restored.id} at ${fmtTime(restored.restore_timestamp)}` +
        (restored.external_path ? ` from ${restored.external_path}` : "")
      : "";
    $("checkpoint-summary").replaceChildren(...[
      line("End-to-end", summary.end_to_end_duration, fmtMs),
      line("Checkpointed", summary.checkpointed_size, fmtBytes),
      line("State size", summary.state_size, fmtBytes),
      restored ? item("Restored", restoredFrom) : null,
    ].filter(Boolean));
    const history = cps.history || [];
    renderTimeline(history);
    $("history").replaceChildren(...history.map((c) => {
      const status = String(c.status).toLowerCase();
      const type = c.is_savepoint ? (c.checkpoint_type === "SYNC_SAVEPOINT" ? "savepoint (sync)" : "savepoint")
        : c.checkpoint_type === "UNALIGNED_CHECKPOINT" ? "checkpoint (unaligned)" : "checkpoint";
      const statusCell = el("td", null, el("span", { class: `state ${status}` }, c.status));
      if (c.failure_message) statusCell.append(el("div", { class: "failure" }, c.failure_message));
      return el("tr", {
        "data-checkpoint-id": c.id, class: status, "aria-selected": c.id === state.selected ? "true" : null,
        title: c.external_path || null,
      },
      num(c.id), el("td", null, type), statusCell, num(`${c.num_acknowledged_subtasks}/${c.num_subtasks}`),
      el("td", null, fmtTime(c.trigger_timestamp)), el("td", null, fmtTime(c.latest_ack_timestamp)),
      num(fmtMs(c.end_to_end_duration)), num(fmtBytes(c.checkpointed_size)), num(fmtBytes(c.state_size)),
      num(fmtBytes(c.processed_data)), num(fmtBytes(c.persisted_data)));
    }));
  }

  // Each checkpoint is a bar from its trigger to its end (now for one in progress), in the
  // first lane where it overlaps no other bar.
  function renderTimeline(history) {
    const chart = $("timeline");
    const W = widthOf(chart, 1000), left = 10, right = 40, lane = 24, bar = 16;
    const now = state.job && isNumber(state.job.now) ? state.job.now : Date.now();
    const spans = history.filter((c) => c.trigger_timestamp > 0).map((c) => {
      let end = c.trigger_timestamp + Math.max(0, c.end_to_end_duration || 0);
      if (c.status === "IN_PROGRESS") end = Math.max(end, now);
      if (c.status === "FAILED" && c.failure_timestamp > 0) end = c.failure_timestamp;
      return { c, start: c.trigger_timestamp, end };
    }).sort((a, b) => a.start - b.start);
    if (!spans.length) {
      chart.setAttribute("viewBox", `0 0 ${W} 40`);
      chart.style.height = "40px";
      chart.replaceChildren(svg("text", { x: W / 2, y: 24, "text-anchor": "middle", class: "empty" }, "no checkpoint yet"));
      return;
    }
    const t0 = spans[0].start;
    const t1 = Math.max(t0 + 1000, ...spans.map((s) => s.end));
    const x = (t) => left + ((t - t0) / (t1 - t0)) * (W - left - right);
    const laneEnds = [];
    const bars = spans.map((s) => {
      const x0 = x(s.start), x1 = Math.max(x(s.end), x0 + 6);
      let i = laneEnds.findIndex((end) => end + 18 <= x0); // room for the previous bar's label
      if (i < 0) { i = laneEnds.length; laneEnds.push(0); }
      laneEnds[i] = x1;
      return { ...s, x0, x1, lane: i };
    });
    const height = laneEnds.length * lane + 26;
    chart.setAttribute("viewBox", `0 0 ${W} ${height}`);
    chart.style.height = `${height}px`;
    const nodes = [];
    const axisY = laneEnds.length * lane + 4;
    nodes.push(svg("line", { x1: left, x2: W - right, y1: axisY, y2: axisY, class: "grid" }));
    for (let k = 0; k <= 4; k += 1) {
      const t = t0 + ((t1 - t0) * k) / 4;
      const anchor = k === 0 ? "start" : k === 4 ? "end" : "middle";
      nodes.push(svg("text", { x: x(t), y: axisY + 16, "text-anchor": anchor, class: "axis" }, fmtTime(t).slice(0, 8)));
    }
    for (const b of bars) {
      const c = b.c;
      const classes = ["bar", String(c.status).toLowerCase()];
      if (c.is_savepoint) classes.push("savepoint");
      if (c.id === state.selected) classes.push("selected");
      const group = svg("g", { "data-id": c.id, class: classes.join(" ") });
      const y = b.lane * lane + 4;
      group.append(svg("rect", { x: b.x0, y, width: b.x1 - b.x0, height: bar, rx: 2 }));
      group.append(svg("text", { x: b.x1 + 3, y: y + 12, class: "label" }, String(c.id)));
      const what = c.is_savepoint ? "Savepoint" : "Checkpoint";
      const tip = `${what} ${c.id}: ${c.status}, ${fmtMs(c.end_to_end_duration)}, ${fmtBytes(c.checkpointed_size)}`;
      group.append(svg("title", {}, tip));
      nodes.push(group);
    }
    chart.replaceChildren(...nodes);
  }

  function renderSelected() {
    const id = state.selected;
    $("follow").hidden = !state.pinned;
    const details = id === null ? null : state.details.get(id);
    if (!details) {
      $("selected-title").textContent = id === null ? "Checkpoint" : `Checkpoint ${id}`;
      $("diagnosis").textContent = id === null ? "No completed checkpoint yet." : `Loading checkpoint ${id}…`;
      $("subtasks").replaceChildren();
      return;
    }
    const entry = details.entry;
    const status = String(entry.status).toLowerCase().replace("_", " ");
    $("selected-title").textContent = `${entry.is_savepoint ? "Savepoint" : "Checkpoint"} ${entry.id} · ${status} · ` +
      `${entry.num_acknowledged_subtasks}/${entry.num_subtasks} acknowledged · end-to-end ${fmtMs(entry.end_to_end_duration)}`;
    const trigger = entry.trigger_timestamp;
    const rows = [];
    for (const task of details.tasks) {
      const name = state.vertexNames.get(task.id) || task.id;
      const subtasks = [...((task.stats && task.stats.subtasks) || [])].sort((a, b) => a.index - b.index);
      for (const s of subtasks) {
        rows.push({ name, s, acked: s.status === "completed" && isNumber(s.ack_timestamp) && s.ack_timestamp > 0 });
      }
    }
    let last = null;
    for (const r of rows) if (r.acked && (last === null || r.s.ack_timestamp > last.s.ack_timestamp)) last = r;
    let slowest = -1;
    if (last) {
      PHASES.forEach(([, value], i) => {
        const v = value(last.s);
        if (isNumber(v) && (slowest < 0 || v > PHASES[slowest][1](last.s))) slowest = i;
      });
    }
    $("subtasks").replaceChildren(...rows.map((r) => {
      const s = r.s;
      const isLast = r === last;
      const acknowledged = el("td", { class: "num" }, r.acked ? `+${fmtMs(s.ack_timestamp - trigger)}` : "pending");
      if (isLast) acknowledged.prepend(el("span", { class: "badge" }, "acknowledged last"));
      const cells = [
        el("td", null, r.name), num(s.index), acknowledged, num(fmtMs(s.end_to_end_duration)),
        ...PHASES.map(([, value]) => num(fmtMs(value(s)))),
        num(fmtBytes(s.state_size)), num(fmtBytes(s.checkpointed_size)),
        el("td", null, s.unaligned_checkpoint === undefined ? "—" : s.unaligned_checkpoint ? "yes" : "no"),
      ];
      if (isLast && slowest >= 0) cells[FIRST_PHASE_COLUMN + slowest].classList.add("slowest");
      return el("tr", { class: isLast ? "last-ack" : null, "data-vertex": r.name, "data-index": s.index }, ...cells);
    }));
    if (!last) {
      $("diagnosis").textContent = rows.length
        ? `No subtask has acknowledged checkpoint ${entry.id} yet.`
        : `Checkpoint ${entry.id} has no subtasks.`;
    } else {
      const phase = slowest >= 0 ? `; its slowest phase: ${PHASES[slowest][0]} (${fmtMs(PHASES[slowest][1](last.s))})` : "";
      const after = fmtMs(last.s.ack_timestamp - trigger);
      $("diagnosis").textContent = `Subtask ${last.s.index} of ${last.name} acknowledged last, ${after} after the trigger${phase}.`;
    }
  }

  // ---- Events -------------------------------------------------------------

  $("history").addEventListener("click", (event) => {
    const row = event.target.closest("tr[data-checkpoint-id]");
    if (row) select(Number(row.dataset.checkpointId), true);
  });
  $("timeline").addEventListener("click", (event) => {
    const bar = event.target.closest("[data-id]");
    if (bar) select(Number(bar.getAttribute("data-id")), true);
  });
  $("follow").addEventListener("click", () => {
    const newest = state.checkpoints ? newestCompleted(state.checkpoints) : null;
    select(newest, false);
  });

  tick();
})();
