// The dashboard: polls /metrics/live once a second and redraws its charts.
// The endpoint returns per-second columns (tokens, passes, drafted, accepted, step times, batch,
// waiting, per-drafter counts) for the chosen window, and totals since the server started.

import { $, Colors, getJSON, loadConfig, setupKeyInput } from "./common.js";
import { barChart, lineChart } from "./charts.js";

const POLL_MS = 1000;
const REJECTED = "#d5d9de";
const ratio = (a, b) => (b > 0 ? a / b : null);
const mean = (xs) => {
  const vs = xs.filter((v) => v !== null);
  return vs.length ? vs.reduce((a, b) => a + b, 0) / vs.length : null;
};
const fmt = (v, digits = 2) => (v === null ? "–" : v.toFixed(digits));
let colors = new Colors([]);

function draw(data) {
  const ts = data.t;
  const n = ts.length;
  const at = (col, i) => data[col][i];
  const tps = ts.map((_, i) => at("tokens", i) / data.interval);
  const tau = ts.map((_, i) => ratio(at("tokens", i), at("passes", i)));
  const acceptance = ts.map((_, i) => ratio(at("accepted", i), at("drafted", i))); // accepted / drafted
  const draftShare = ts.map((_, i) => ratio(at("draft_seconds", i), at("step_seconds", i)));
  const verifyShare = ts.map((_, i) => ratio(at("verify_seconds", i), at("step_seconds", i)));
  const batch = ts.map((_, i) => ratio(at("batch", i), at("steps", i)) ?? 0);
  const waiting = data.waiting;
  const recent = (xs) => mean(xs.slice(Math.max(0, n - 10))); // the last 10 seconds

  lineChart($("#chart-tps"), { ts, label: "tokens per second", series: [{ name: "tok/s", color: "#1b86c4", values: tps }] });
  $("#readout-tps").textContent = `last 10 s: ${fmt(recent(tps), 1)} tok/s`;
  lineChart($("#chart-tau"), { ts, label: "tau",
    series: [{ name: "τ", color: "#1a9e5a", values: tau }] });
  $("#readout-tau").textContent = `last 10 s: ${fmt(recent(tau))}`;
  lineChart($("#chart-acceptance"), { ts, label: "acceptance rate", yMax: 1,
    series: [{ name: "acceptance rate", color: "#b04fc4", values: acceptance }] });
  $("#readout-acceptance").textContent = `since start: ${fmt(data.totals.drafted ? data.totals.acceptance_rate : null)}`;
  lineChart($("#chart-share"), { ts, label: "draft and verify share of step time", yMax: 1,
    format: (v) => `${Math.round(v * 100)}%`,
    series: [{ name: "drafting", color: "#d08a00", values: draftShare },
             { name: "verifying", color: "#4a5ad8", values: verifyShare }] });
  const share = recent(draftShare);
  $("#readout-share").textContent = `last 10 s: drafting ${share === null ? "–" : Math.round(100 * share)}%`;
  lineChart($("#chart-batch"), { ts, label: "batch size and queue depth",
    series: [{ name: "batch", color: "#1a9e5a", values: batch }, { name: "waiting", color: "#d0453d", values: waiting }] });
  $("#readout-batch").textContent = `now: batch ${fmt(batch[n - 1], 1)}, waiting ${waiting[n - 1]}`;

  const { drafted_per_pos: drafted, accepted_per_pos: accepted } = data.totals;
  barChart($("#chart-position"), { label: "acceptance by draft position", max: 1, empty: "no drafts yet",
    bars: drafted.map((d, i) => ({
      label: `position ${i + 1}`,
      parts: [{ name: "accepted", value: accepted[i] / d, color: "#1a9e5a" },
              { name: "rejected", value: 1 - accepted[i] / d, color: REJECTED }],
      note: `${Math.round((100 * accepted[i]) / d)}% of ${d}`,
    })) });

  const byDrafter = Object.entries(data.totals.by_drafter);
  barChart($("#chart-drafters"), { label: "drafted tokens by drafter", empty: "no drafts yet",
    bars: byDrafter.map(([name, s]) => ({
      label: name,
      parts: [{ name: "accepted", value: s.accepted, color: colors.of(name) },
              { name: "rejected", value: s.drafted - s.accepted, color: REJECTED }],
      note: `acceptance rate ${s.acceptance_rate.toFixed(2)}`,
    })) });
  lineChart($("#chart-drafter-rate"), { ts, label: "accepted tokens per second by drafter",
    series: Object.entries(data.drafters).map(([name, cols]) => ({
      name, color: colors.of(name), values: cols.map(([, acc]) => acc / data.interval) })) });
}

async function poll() {
  const status = $("#status");
  if (!$("#pause").checked) {
    try {
      draw(await getJSON(`/metrics/live?window=${$("#window").value}`));
      status.textContent = `updated ${new Date().toLocaleTimeString()}`;
      status.classList.remove("status-error");
      document.body.dataset.updates = String(Number(document.body.dataset.updates || 0) + 1);
    } catch (err) {
      status.textContent = err.status === 401 ? "enter the server's API key above" : `no data: ${err.message}`;
      status.classList.add("status-error");
    }
  }
  setTimeout(poll, POLL_MS);
}

// The server's settings (behind the API key when one is set: read again once a key is entered).
async function showConfig() {
  try {
    const config = await loadConfig();
    $("#model").textContent = config.model;
    colors = new Colors(config.drafters);
  } catch (err) {
    $("#status").textContent = err.status === 401 ? "enter the server's API key above"
      : `cannot read the server's settings: ${err.message}`;
  }
}

async function init() {
  setupKeyInput(showConfig);
  await showConfig();
  poll();
}

init();
