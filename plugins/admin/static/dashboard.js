// msgbroker's live dashboard: samples arrive over server-sent events (/events), one per
// sample interval; the charts are hand-drawn SVG polylines over the last HISTORY samples.
"use strict";

const HISTORY = 120;
// a chart spans at least this many samples, so that a new broker's first ones do not
// stretch across the whole width
const MIN_SPAN = 30;
let sampleSeconds = 1;
const COLORS = ["#2563eb", "#d97706", "#059669", "#db2777", "#7c3aed", "#0891b2", "#65a30d", "#dc2626"];
const samples = [];
const colorOf = {};

function color(name) {
  if (!(name in colorOf)) colorOf[name] = COLORS[Object.keys(colorOf).length % COLORS.length];
  return colorOf[name];
}

function $(id) { return document.getElementById(id); }

function el(tag, attrs, text) {
  const node = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs || {})) node.setAttribute(k, v);
  if (text !== undefined) node.textContent = text;
  return node;
}

function number(value) {
  if (value >= 1e9) return (value / 1e9).toFixed(1) + " G";
  if (value >= 1e6) return (value / 1e6).toFixed(1) + " M";
  if (value >= 1e4) return (value / 1e3).toFixed(1) + " k";
  return Number.isInteger(value) ? String(value) : value.toFixed(1);
}

// an axis label: short, no trailing ".0" (5 k, 12.5 k, 1.5 M)
function compact(value) {
  for (const [unit, size] of [["G", 1e9], ["M", 1e6], ["k", 1e3]]) {
    if (value >= size) return `${+(value / size).toFixed(1)} ${unit}`;
  }
  return String(+value.toFixed(1));
}

function bytes(value) {
  if (value >= 1 << 30) return (value / (1 << 30)).toFixed(1) + " GiB";
  if (value >= 1 << 20) return (value / (1 << 20)).toFixed(1) + " MiB";
  if (value >= 1 << 10) return (value / (1 << 10)).toFixed(1) + " KiB";
  return value + " B";
}

function duration(seconds) {
  seconds = Math.floor(seconds);
  const d = Math.floor(seconds / 86400), h = Math.floor(seconds / 3600) % 24;
  const m = Math.floor(seconds / 60) % 60, s = seconds % 60;
  if (d) return `up ${d} d ${h} h`;
  if (h) return `up ${h} h ${m} min`;
  if (m) return `up ${m} min ${s} s`;
  return `up ${s} s`;
}

// one line per series over the samples; the y axis from 0 to a round maximum (for
// whole counts, such as connections, one whose four grid steps are whole too)
function chart(svgId, legendId, series, whole = false) {
  const svg = $(svgId);
  const W = 600, H = 180, top = 8, bottom = 18, left = 44;
  let max = 0;
  for (const values of Object.values(series)) for (const v of values) max = Math.max(max, v);
  max = whole ? wholeMax(max) : niceMax(max);
  const parts = [];
  for (let i = 0; i <= 4; i++) {
    const y = top + (H - top - bottom) * i / 4;
    parts.push(`<line class="grid" x1="${left}" x2="${W}" y1="${y}" y2="${y}"/>`);
    parts.push(`<text class="axis" x="${left - 4}" y="${y + 4}" text-anchor="end">${compact(max * (4 - i) / 4)}</text>`);
  }
  const span = Math.min(HISTORY, Math.max(MIN_SPAN, samples.length));
  parts.push(`<text class="axis" x="${left}" y="${H - 3}">−${Math.round((span - 1) * sampleSeconds)} s</text>`);
  parts.push(`<text class="axis" x="${W - 2}" y="${H - 3}" text-anchor="end">now</text>`);
  const legend = $(legendId);
  legend.textContent = "";
  for (const [name, values] of Object.entries(series)) {
    const step = (W - left) / (span - 1);
    const offset = span - values.length;
    const points = values.map((v, i) => {
      const x = left + (offset + i) * step;
      const y = top + (H - top - bottom) * (1 - (max ? v / max : 0));
      return `${x.toFixed(1)},${y.toFixed(1)}`;
    }).join(" ");
    parts.push(`<polyline stroke="${color(name)}" points="${points}"><title>${escapeHtml(name)}</title></polyline>`);
    const item = el("span");
    item.append(el("i", {style: `background:${color(name)}`}), document.createTextNode(name));
    legend.append(item);
  }
  svg.innerHTML = parts.join("");
}

function niceMax(value) {
  if (value <= 0) return 1;
  const magnitude = Math.pow(10, Math.floor(Math.log10(value)));
  for (const step of [1, 2, 2.5, 5, 10]) if (step * magnitude >= value) return step * magnitude;
  return 10 * magnitude;
}

// a maximum of four whole grid steps of 1, 2 or 5 times a power of ten
function wholeMax(value) {
  const target = value / 4;
  if (target <= 1) return 4;
  const magnitude = Math.pow(10, Math.floor(Math.log10(target)));
  for (const step of [1, 2, 5, 10]) if (step * magnitude >= target) return 4 * step * magnitude;
  return 40 * magnitude;
}

function escapeHtml(text) {
  return String(text).replace(/[&<>"]/g, c => ({"&": "&amp;", "<": "&lt;", ">": "&gt;", '"': "&quot;"}[c]));
}

function seriesOf(pick) {
  const names = new Set();
  for (const s of samples) for (const name of Object.keys(pick(s))) names.add(name);
  const out = {};
  for (const name of [...names].sort()) out[name] = samples.map(s => pick(s)[name] || 0);
  return out;
}

function rates(key) {
  return s => Object.fromEntries(Object.entries(s.rates).map(([p, r]) => [p, r[key]]));
}

function fillTable(id, rows, empty) {
  const body = $(id).querySelector("tbody");
  body.textContent = "";
  if (!rows.length) {
    const tr = el("tr", {class: "empty"});
    tr.append(el("td", {colspan: $(id).querySelectorAll("th").length}, empty));
    body.append(tr);
    return;
  }
  for (const cells of rows) {
    const tr = el("tr");
    for (const cell of cells) {
      if (cell instanceof Node) { const td = el("td"); td.append(cell); tr.append(td); continue; }
      const [text, cls] = Array.isArray(cell) ? cell : [cell, ""];
      tr.append(el("td", cls ? {class: cls} : {}, text));
    }
    body.append(tr);
  }
}

function render() {
  const last = samples[samples.length - 1];
  if (!last) return;
  const totalRate = key => Object.values(last.rates).reduce((a, r) => a + r[key], 0);
  $("uptime").textContent = duration(last.uptime);
  $("tile-connections").textContent = number(Object.values(last.connections).reduce((a, b) => a + b, 0));
  $("tile-in").textContent = number(totalRate("messages_in"));
  $("tile-out").textContent = number(last.delivery_rate);
  $("tile-topics").textContent = number(last.topic_count);
  $("tile-dropped").textContent = number(last.totals.dropped);
  $("tile-slow").textContent = number(last.totals.slow_disconnects);
  $("tile-failures").textContent = number(last.totals.login_failures);
  chart("chart-connections", "legend-connections", seriesOf(s => s.connections), true);
  chart("chart-in", "legend-in", seriesOf(rates("messages_in")));
  chart("chart-out", "legend-out", seriesOf(rates("bytes_out")));
  const busiest = last.topics.slice(0, 6).map(t => t.topic);
  const topicSeries = {};
  for (const name of busiest) {
    topicSeries[name] = samples.map(s => (s.topics.find(t => t.topic === name) || {rate: 0}).rate);
  }
  chart("chart-topics", "legend-topics", topicSeries);
  fillTable("topics", last.topics.map(t => [
    [t.topic, "topic"], [number(t.subscribers), "num"], [number(t.rate), "num"], [number(t.published), "num"],
  ]), "No topic has subscribers yet.");
  fillTable("slow", last.slow.map(s => [
    String(s.id), s.identity || "–", s.protocol, s.host || "local",
    [bytes(s.backlog), "num bad"], [number(s.dropped), s.dropped ? "num bad" : "num"],
  ]), "Every consumer keeps up.");
}

function setStatus(live) {
  const status = $("status");
  status.textContent = live ? "live" : "reconnecting";
  status.className = "status " + (live ? "on" : "off");
}

function connect() {
  const events = new EventSource("/events");
  events.onopen = () => setStatus(true);
  events.onerror = () => setStatus(false);
  events.addEventListener("history", e => {
    samples.length = 0;
    samples.push(...JSON.parse(e.data).slice(-HISTORY));
    render();
  });
  events.addEventListener("sample", e => {
    samples.push(JSON.parse(e.data));
    if (samples.length > HISTORY) samples.shift();
    render();
    const now = Date.now();
    // every 2 s, and at once when sessions came or went
    const open = Object.values(samples[samples.length - 1].connections).reduce((a, b) => a + b, 0);
    if (now - sessionsLoaded > 2000 || open !== sessionsListed) loadSessions();
    if (now - infoLoaded > 10000) loadInfo();
  });
}

let sessionsLoaded = 0, sessionsListed = -1, infoLoaded = 0;

async function loadInfo() {
  infoLoaded = Date.now();
  const response = await fetch("/api/info", {credentials: "same-origin"});
  if (!response.ok) return;
  const info = await response.json();
  sampleSeconds = info.admin.sample_seconds;
  $("version").textContent = "version " + info.version;
  $("listeners").textContent = info.listeners.map(l => `${l.protocol} ${l.address}`).join(" · ");
  const list = $("slow-closed");
  list.textContent = "";
  for (const s of info.slow_closed.slice().reverse()) {
    const when = new Date(s.at * 1000).toLocaleTimeString();
    list.append(el("li", {}, `${when}: ${s.protocol} ${s.identity || "–"} (${s.host || "local"}), ${s.dropped} deliveries it could not take`));
  }
  if (!info.slow_closed.length) list.append(el("li", {class: "empty"}, "None."));
}

async function loadSessions() {
  sessionsLoaded = Date.now();
  const response = await fetch("/api/sessions", {credentials: "same-origin"});
  if (!response.ok) return;
  const {sessions} = await response.json();
  sessionsListed = sessions.length;
  $("session-count").textContent = `(${sessions.length})`;
  fillTable("sessions", sessions.map(s => {
    const kick = el("button", {class: "kick", title: "close this session"}, "kick");
    kick.onclick = async () => {
      if (!confirm(`Kick session ${s.id} (${s.identity || "not logged in"})?`)) return;
      await fetch(`/api/sessions/${s.id}/kick`, {method: "POST", credentials: "same-origin"});
      loadSessions();
    };
    return [
      String(s.id), s.identity || "–", s.protocol, s.address || "local",
      new Date(s.since).toLocaleTimeString(),
      [number(s.messages_in), "num"],
      [bytes(s.bytes_in), "num"], [bytes(s.bytes_out), "num"],
      [bytes(s.backlog), s.backlog ? "num bad" : "num"], kick,
    ];
  }), "No open session.");
}

connect();
loadInfo();
loadSessions();
