// Small SVG charts for the dashboard: a time-series line chart and horizontal bars.
// Each chart redraws from scratch on every update (a few hundred points: cheap) and
// marks its <svg> with data-updates / data-last so people and tests can read the state.

const NS = "http://www.w3.org/2000/svg";
const W = 480, H = 170, PAD = { left: 44, right: 10, top: 12, bottom: 22 };

function svgEl(tag, attrs = {}, text = "") {
  const node = document.createElementNS(NS, tag);
  for (const [k, v] of Object.entries(attrs)) node.setAttribute(k, v);
  if (text) node.textContent = text;
  return node;
}

// 0.5 -> "0.5", 2 -> "2", 250 -> "250": axis labels without noise.
export const short = (v) => (Math.abs(v) >= 10 ? v.toFixed(0) : String(Number(v.toFixed(1))));

function niceMax(v) {
  if (!(v > 0)) return 1;
  const p = 10 ** Math.floor(Math.log10(v));
  return [1, 2, 2.5, 5, 10].map((m) => m * p).find((m) => m >= v);
}

function reset(svg, label) {
  svg.replaceChildren();
  svg.setAttribute("viewBox", `0 0 ${W} ${H}`);
  svg.setAttribute("role", "img");
  svg.setAttribute("aria-label", label);
  svg.dataset.updates = String(Number(svg.dataset.updates || 0) + 1);
}

// series: [{name, color, values: (number|null)[]}], all as long as ts (seconds, oldest first).
// null is a gap (e.g. no draft in that second, so no acceptance rate).
export function lineChart(svg, { ts, series, yMax = null, format = short, label = "" }) {
  reset(svg, label);
  const all = series.flatMap((s) => s.values).filter((v) => v !== null && Number.isFinite(v));
  const top = yMax ?? niceMax(Math.max(0, ...all));
  const x = (i) => PAD.left + (i / Math.max(1, ts.length - 1)) * (W - PAD.left - PAD.right);
  const y = (v) => H - PAD.bottom - (Math.min(v, top) / top) * (H - PAD.top - PAD.bottom);
  for (const f of [0, 0.5, 1]) {
    const v = top * f;
    svg.append(svgEl("line", { x1: PAD.left, x2: W - PAD.right, y1: y(v), y2: y(v), class: "grid" }));
    svg.append(svgEl("text", { x: PAD.left - 6, y: y(v) + 4, class: "tick", "text-anchor": "end" }, format(v)));
  }
  const span = ts.length ? ts[ts.length - 1] - ts[0] : 0;
  for (const [i, anchor, text] of [[0, "start", `-${Math.round(span)}s`], [ts.length - 1, "end", "now"]]) {
    svg.append(svgEl("text", { x: x(Math.max(0, i)), y: H - 6, class: "tick", "text-anchor": anchor }, text));
  }
  series.forEach((s, k) => {
    let d = "", pen = "M";
    s.values.forEach((v, i) => {
      if (v === null || !Number.isFinite(v)) { pen = "M"; return; }
      d += `${pen}${x(i).toFixed(1)},${y(v).toFixed(1)} `;
      pen = "L";
    });
    if (d) svg.append(svgEl("path", { d, class: "line", stroke: s.color }));
    const lastAt = s.values.findLastIndex((v) => v !== null && Number.isFinite(v));
    if (lastAt >= 0) svg.append(svgEl("circle", { cx: x(lastAt), cy: y(s.values[lastAt]), r: 2.5, fill: s.color }));
    if (k === 0) {
      svg.dataset.last = lastAt >= 0 ? String(s.values[lastAt]) : "";
      svg.dataset.max = String(Math.max(0, ...s.values.filter((v) => v !== null && Number.isFinite(v))));
    }
    if (series.length > 1) {
      const lx = W - PAD.right - 120 * (series.length - k);
      svg.append(svgEl("rect", { x: lx, y: 2, width: 10, height: 3, fill: s.color }));
      svg.append(svgEl("text", { x: lx + 14, y: 8, class: "tick" }, s.name));
    }
  });
}

// bars: [{label, parts: [{value, color, name}], note}], drawn as horizontal stacked bars.
export function barChart(svg, { bars, max = null, label = "", empty = "no data yet" }) {
  reset(svg, label);
  if (!bars.length) {
    svg.append(svgEl("text", { x: W / 2, y: H / 2, class: "tick", "text-anchor": "middle" }, empty));
    svg.dataset.last = "";
    return;
  }
  const top = max ?? niceMax(Math.max(...bars.map((b) => b.parts.reduce((a, p) => a + p.value, 0))));
  const left = 110, right = 70;
  const rowH = Math.min(22, (H - 8) / bars.length);
  bars.forEach((b, i) => {
    const y0 = 4 + i * rowH;
    svg.append(svgEl("text", { x: left - 6, y: y0 + rowH * 0.7, class: "tick", "text-anchor": "end" }, b.label));
    let x0 = left;
    for (const p of b.parts) {
      const w = (p.value / top) * (W - left - right);
      const rect = svgEl("rect", { x: x0, y: y0 + 2, width: Math.max(0, w), height: rowH - 4, fill: p.color });
      rect.append(svgEl("title", {}, `${p.name}: ${p.value}`));
      svg.append(rect);
      x0 += w;
    }
    if (b.note) svg.append(svgEl("text", { x: x0 + 4, y: y0 + rowH * 0.7, class: "tick" }, b.note));
  });
  svg.dataset.last = String(bars[0].parts[0].value);
}
