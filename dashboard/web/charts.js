// Inline SVG line charts with axes, units and a legend.
import { h } from './ui.js';

const NS = 'http://www.w3.org/2000/svg';
const COLORS = ['#0b5cad', '#c2410c', '#1a7f37', '#8250df', '#b42318', '#0e7490', '#9a6700', '#d63384', '#57606a'];
let chartId = 0;

function s(tag, attrs, ...children) {
  const el = document.createElementNS(NS, tag);
  for (const [k, v] of Object.entries(attrs || {})) el.setAttribute(k, v);
  for (const c of children) el.append(c);
  return el;
}

function niceStep(range, ticks) {
  const raw = range / ticks;
  const p = 10 ** Math.floor(Math.log10(raw));
  const f = raw / p;
  return (f <= 1 ? 1 : f <= 2 ? 2 : f <= 2.5 ? 2.5 : f <= 5 ? 5 : 10) * p;
}
const fmtNum = (v) => (v === 0 ? '0' : Math.abs(v) >= 100 ? v.toFixed(0) : Math.abs(v) >= 1 ? +v.toFixed(2) + '' : +v.toPrecision(2) + '');
const hhmm = (t) => new Date(t).toLocaleTimeString([], { hour: '2-digit', minute: '2-digit', hour12: false });

// series: [{name, points: [[timeMs, value], ...]}]; unit: e.g. 'cores'; from/to: the time range (ms).
export function lineChart({ title, unit, yLabel, series, from, to, note, gap = 60000 }) {
  const W = 640, H = 250, L = 72, R = 14, T = 14, B = 42;
  const id = `chart-${++chartId}`;
  const all = series.flatMap((x) => x.points.map((p) => p[1])).filter(isFinite);
  let max = all.length ? Math.max(...all) : 0;
  if (max <= 0) max = 1;
  const step = niceStep(max, 4);
  const yMax = Math.ceil(max / step) * step || 1;
  if (!(to > from)) to = from + 60000;
  const x = (t) => L + ((t - from) / (to - from)) * (W - L - R);
  const y = (v) => T + (1 - v / yMax) * (H - T - B);

  const svg = s('svg', { viewBox: `0 0 ${W} ${H}`, role: 'img', 'aria-labelledby': `${id}-t ${id}-d`, focusable: 'false' });
  const latest = series.map((x) => `${x.name}: ${x.points.length ? fmtNum(x.points[x.points.length - 1][1]) + ' ' + unit : 'no data'}`);
  svg.append(s('title', { id: `${id}-t` }, title), s('desc', { id: `${id}-d` }, `Latest values: ${latest.join('; ') || 'no data'}.`));

  // grid + y axis
  const axes = s('g', { 'font-size': '12', fill: '#57606a', 'font-family': 'system-ui, sans-serif' });
  for (let v = 0; v <= yMax + step / 2; v += step) {
    axes.append(s('line', { x1: L, x2: W - R, y1: y(v), y2: y(v), stroke: '#e5e9ee' }),
      s('text', { x: L - 6, y: y(v) + 4, 'text-anchor': 'end' }, fmtNum(v)));
  }
  // x axis ticks: every 5/10/15 minutes, depending on the range
  const span = to - from;
  const tick = [60e3, 120e3, 300e3, 600e3, 900e3, 1800e3].find((t) => span / t <= 7) || 3600e3;
  for (let t = Math.ceil(from / tick) * tick; t <= to; t += tick) {
    axes.append(s('line', { x1: x(t), x2: x(t), y1: H - B, y2: H - B + 4, stroke: '#57606a' }),
      s('text', { x: x(t), y: H - B + 16, 'text-anchor': 'middle' }, hhmm(t)));
  }
  axes.append(
    s('line', { x1: L, x2: W - R, y1: H - B, y2: H - B, stroke: '#57606a' }),
    s('line', { x1: L, x2: L, y1: T, y2: H - B, stroke: '#57606a' }),
    s('text', { x: (L + W - R) / 2, y: H - 6, 'text-anchor': 'middle' }, 'time'),
    s('text', { x: 12, y: (T + H - B) / 2, 'text-anchor': 'middle', transform: `rotate(-90 12 ${(T + H - B) / 2})` }, yLabel || unit));
  svg.append(axes);

  series.forEach((ser, i) => {
    const color = COLORS[i % COLORS.length];
    let d = '', prev = null;
    const pts = ser.points.filter((p) => isFinite(p[1]));
    for (const [t, v] of pts) {
      d += `${prev === null || t - prev > gap ? 'M' : 'L'}${x(t).toFixed(1)},${y(v).toFixed(1)}`;
      prev = t;
    }
    if (d) svg.append(s('path', { d, fill: 'none', stroke: color, 'stroke-width': i === 0 && ser.total ? '2.5' : '1.8', 'stroke-linejoin': 'round' }));
    // lone points (or very few) are drawn as dots
    if (pts.length <= 3) for (const [t, v] of pts) svg.append(s('circle', { cx: x(t), cy: y(v), r: 3, fill: color }));
  });

  const legend = h('ul', { class: 'legend', 'aria-label': `${title} legend` }, series.map((ser, i) =>
    h('li', null, h('span', { class: 'sw', style: `background:${COLORS[i % COLORS.length]}`, 'aria-hidden': 'true' }),
      `${ser.name}${ser.points.length ? ` (now ${fmtNum(ser.points[ser.points.length - 1][1])} ${unit})` : ' (no data)'}`)));
  if (!series.length) legend.append(h('li', null, 'No data yet'));
  return h('figure', { class: 'chart' }, h('figcaption', null, title, note ? h('div', { class: 'note' }, note) : null), svg, legend);
}
