// The playground: a chat that streams through /v1/chat/completions and colours each token by origin.
// Every chunk carries spec_decode.tokens (text pieces) and .origins (a drafter's name or "target");
// with spec_decode_detail, .steps also lists each step's rejected drafted tokens.

import { $, Colors, TARGET, authHeaders, el, legend, loadConfig, setupKeyInput } from "./common.js";

const state = { history: [], colors: new Colors([]), busy: false, controller: null };

// Server-sent events of a fetch response -> parsed JSON payloads (stops at [DONE]).
async function* sseEvents(response) {
  const reader = response.body.getReader();
  const decoder = new TextDecoder();
  let buffer = "";
  for (;;) {
    const { value, done } = await reader.read();
    if (done) return;
    buffer += decoder.decode(value, { stream: true });
    let cut;
    while ((cut = buffer.indexOf("\n\n")) >= 0) {
      const event = buffer.slice(0, cut);
      buffer = buffer.slice(cut + 2);
      for (const line of event.split("\n")) {
        if (!line.startsWith("data: ")) continue;
        const data = line.slice(6);
        if (data === "[DONE]") return;
        yield JSON.parse(data);
      }
    }
  }
}

function addMessage(role, text = "") {
  const node = el("div", { class: `msg ${role}` });
  node.append(el("div", { class: "role" }, role), el("div", { class: "body" }, text));
  $("#messages").append(node);
  node.scrollIntoView({ block: "end" });
  return node;
}

// One assistant answer as it streams in: token spans, rejected drafts, then the stats line.
class AnswerView {
  constructor(showRejected) {
    this.node = addMessage("assistant");
    this.body = $(".body", this.node);
    this.showRejected = showRejected;
    this.count = 0; // tokens so far
    this.text = "";
    this.byOrigin = new Map();
    this.rejectedAt = new Map(); // token index -> [{text, drafter}] shown just before that token
    this.firstTokenAt = null; // performance.now() of the first tokens: decoding is timed from there
  }

  addSteps(steps) {
    for (const s of steps) {
      if (!s.rejected.length) continue;
      this.rejectedAt.set(s.start + s.accepted, s.rejected.map((text) => ({ text, drafter: s.drafter })));
    }
  }

  addTokens(tokens, origins) {
    if (this.firstTokenAt === null && tokens.length) this.firstTokenAt = performance.now();
    tokens.forEach((piece, i) => {
      const origin = origins[i] ?? TARGET;
      const index = this.count++;
      this.byOrigin.set(origin, (this.byOrigin.get(origin) || 0) + 1);
      if (this.showRejected && this.rejectedAt.has(index)) {
        for (const r of this.rejectedAt.get(index)) {
          this.body.append(el("s", { class: "rejected", title: `rejected draft (${r.drafter})` }, r.text));
        }
      }
      if (!piece) return;
      this.text += piece;
      const span = el("span", { class: "tok", "data-origin": origin, title: origin }, piece);
      const color = state.colors.of(origin);
      if (color) {
        span.classList.add("drafted");
        span.style.background = `${color}2e`;
        span.style.color = "inherit";
        span.style.borderBottomColor = color;
      }
      this.body.append(span);
    });
    this.node.scrollIntoView({ block: "end" });
  }

  finish(spec, usage, seconds) {
    const stats = el("div", { class: "stats" });
    const n = usage?.completion_tokens ?? this.count;
    const tps = seconds > 0 ? n / seconds : 0;
    const item = (name, value, key) => {
      const span = el("span", { "data-stat": key });
      span.append(document.createTextNode(`${name} `), el("b", {}, value));
      stats.append(span);
    };
    item("τ", (spec?.mean_accepted_len ?? 0).toFixed(2), "tau");
    item("acceptance rate", spec?.drafted ? spec.acceptance_rate.toFixed(2) : "–", "acceptance");
    item("tok/s", tps.toFixed(1), "tps");
    item("tokens", String(n), "tokens");
    const mix = el("span", { class: "mix", title: "drafter mix" });
    const parts = [];
    for (const [origin, count] of [...this.byOrigin].sort((a, b) => b[1] - a[1])) {
      const share = (100 * count) / Math.max(1, this.count);
      const seg = el("span");
      seg.style.width = `${share}%`;
      seg.style.background = state.colors.of(origin) || "#d5d9de";
      mix.append(seg);
      parts.push(`${origin} ${share.toFixed(0)}%`);
    }
    stats.append(mix);
    const mixText = el("span", { "data-stat": "mix" }, parts.join(" · "));
    stats.append(mixText);
    this.node.append(stats);
  }

  // The same request decoded plainly: its decode time against this answer's, the prefill (time to
  // the first token) beside it, and whether the texts agree (at temperature 0 they must).
  addComparison(plain, decodeSeconds, firstSeconds) {
    const line = el("div", { class: "stats compare" });
    const item = (name, value, key) => {
      const span = el("span", { "data-stat": key });
      span.append(document.createTextNode(`${name} `), el("b", {}, value));
      line.append(span);
    };
    const speedup = decodeSeconds > 0 ? plain.decodeSeconds / decodeSeconds : 0;
    item("speedup vs plain (decode)", `${speedup.toFixed(2)}×`, "speedup");
    item("decode", `${plain.decodeSeconds.toFixed(2)} s → ${decodeSeconds.toFixed(2)} s`, "decode");
    item("first token", `${plain.firstSeconds.toFixed(2)} s / ${firstSeconds.toFixed(2)} s`, "first");
    item("same text", plain.text === this.text ? "yes" : "no", "same");
    this.node.append(line);
  }

  error(message) {
    this.node.classList.add("error");
    this.node.append(el("div", { class: "stats" }, message));
  }
}

function requestBody() {
  const messages = [];
  const system = $("#system").value.trim();
  if (system) messages.push({ role: "system", content: system });
  messages.push(...state.history);
  const body = {
    messages,
    stream: true,
    stream_options: { include_usage: true },
    temperature: Number($("#temperature").value),
    max_tokens: Number($("#max-tokens").value),
    spec_decode_detail: $("#show-rejected").checked,
  };
  const drafter = $("#drafter").value;
  if (drafter) body.spec_decode_drafter = drafter;
  return body;
}

// One request streamed to its end without showing it: its text, time to first token and decode time.
async function timedRun(body, signal) {
  const started = performance.now();
  const response = await fetch("/v1/chat/completions", {
    method: "POST",
    headers: { "Content-Type": "application/json", ...authHeaders() },
    body: JSON.stringify(body),
    signal,
  });
  if (!response.ok) throw new Error(`${response.status} ${response.statusText}`);
  let text = "", first = null;
  for await (const data of sseEvents(response)) {
    if (data.error) throw new Error(data.error.message);
    const tokens = data.spec_decode?.tokens || [];
    if (first === null && tokens.length) first = performance.now();
    text += tokens.join("");
  }
  const end = performance.now();
  first ??= end;
  return { text, firstSeconds: (first - started) / 1000, decodeSeconds: (end - first) / 1000 };
}

async function send(text) {
  state.history.push({ role: "user", content: text });
  addMessage("user", text);
  const view = new AnswerView($("#show-rejected").checked);
  state.controller = new AbortController();
  setBusy(true);
  const started = performance.now();
  let spec = null, usage = null;
  const body = requestBody();
  try {
    const response = await fetch("/v1/chat/completions", {
      method: "POST",
      headers: { "Content-Type": "application/json", ...authHeaders() },
      body: JSON.stringify(body),
      signal: state.controller.signal,
    });
    if (!response.ok) {
      const body = await response.json().catch(() => null);
      throw new Error(body?.error?.message || `${response.status} ${response.statusText}`);
    }
    for await (const data of sseEvents(response)) {
      if (data.error) throw new Error(data.error.message);
      const sd = data.spec_decode || {};
      if (sd.steps) view.addSteps(sd.steps);
      if (sd.tokens) view.addTokens(sd.tokens, sd.origins);
      if (sd.drafted !== undefined) spec = sd;
      if (data.usage) usage = data.usage;
    }
    const ended = performance.now();
    view.finish(spec, usage, (ended - started) / 1000);
    state.history.push({ role: "assistant", content: view.text });
    if ($("#compare").checked && body.spec_decode_drafter !== "none") {
      const first = view.firstTokenAt ?? ended;
      try {  // its own errors: the answer above is kept either way
        const plain = await timedRun({ ...body, spec_decode_drafter: "none", spec_decode_detail: false },
                                     state.controller.signal);
        view.addComparison(plain, (ended - first) / 1000, (first - started) / 1000);
      } catch (err) {
        if (err.name !== "AbortError") view.error(`plain decoding run: ${err.message}`);
      }
    }
  } catch (err) {
    if (err.name === "AbortError") {
      view.finish(spec, null, (performance.now() - started) / 1000);
      state.history.push({ role: "assistant", content: view.text });
    } else {
      view.error(err.message);
      state.history.pop(); // the user's turn got no answer: let them resend it
    }
  } finally {
    setBusy(false);
  }
}

function setBusy(busy) {
  state.busy = busy;
  $("#send").disabled = busy;
  $("#stop").hidden = !busy;
}

async function init() {
  setupKeyInput(showConfig);
  $("#composer").addEventListener("submit", (e) => {
    e.preventDefault();
    const text = $("#prompt").value.trim();
    if (!text || state.busy) return;
    $("#prompt").value = "";
    send(text);
  });
  $("#prompt").addEventListener("keydown", (e) => {
    if (e.key === "Enter" && !e.shiftKey) {
      e.preventDefault();
      $("#composer").requestSubmit();
    }
  });
  $("#stop").addEventListener("click", () => state.controller?.abort());
  $("#clear").addEventListener("click", () => {
    state.history = [];
    $("#messages").replaceChildren();
  });
  await showConfig();
  document.body.dataset.ready = "1";
}

// The server's settings (behind the API key when one is set: read again once a key is entered).
async function showConfig() {
  try {
    const config = await loadConfig();
    $("#model").textContent = config.model;
    state.colors = new Colors(config.drafters);
    const select = $("#drafter");
    select.replaceChildren();
    const all = config.drafters.join(",") || "none";
    select.append(el("option", { value: "" }, `server default (${all})`));
    if (config.drafters.length > 1) config.drafters.forEach((d) => select.append(el("option", { value: d }, d)));
    select.append(el("option", { value: "none" }, "none (plain decoding)"));
    legend($("#legend"), config.drafters, state.colors);
  } catch (err) {
    const why = err.status === 401 ? "enter the server's API key above" : err.message;
    addMessage("error", `cannot read the server's settings: ${why}`).classList.add("error");
  }
}

init();
