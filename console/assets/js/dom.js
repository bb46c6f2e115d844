// Small DOM helpers. Everything the daemon sends is put in the page as
// text (textContent, attribute values), never parsed as markup.

// h builds an element: h('a', {href: '#/x', class: 'y'}, 'text', child).
// Attributes starting with "on" are listeners; children are strings
// (made text nodes), nodes, arrays of either, or null (skipped).
export function h(tag, attrs, ...children) {
  const el = document.createElement(tag);
  setAttrs(el, attrs);
  append(el, children);
  return el;
}

// s builds an SVG element.
export function s(tag, attrs, ...children) {
  const el = document.createElementNS('http://www.w3.org/2000/svg', tag);
  setAttrs(el, attrs);
  append(el, children);
  return el;
}

function setAttrs(el, attrs) {
  for (const [k, v] of Object.entries(attrs || {})) {
    if (v === undefined || v === null || v === false) continue;
    if (k.startsWith('on')) el.addEventListener(k.slice(2), v);
    else if (k === 'value' || k === 'checked') el[k] = v;
    else el.setAttribute(k, v === true ? '' : String(v));
  }
}

function append(el, children) {
  for (const c of children.flat(Infinity)) {
    if (c === null || c === undefined || c === false) continue;
    el.append(c instanceof Node ? c : document.createTextNode(String(c)));
  }
}

// replace empties el and fills it with children.
export function replace(el, ...children) {
  el.replaceChildren();
  append(el, children);
  return el;
}

// status shows a run or span status as text (with a class for colour,
// which only repeats what the text says).
export function status(st) {
  return h('span', { class: `status st-${st || 'unknown'}` }, st || 'unknown');
}

export const terminal = new Set(['succeeded', 'failed', 'cancelled']);

const timeFormat = new Intl.DateTimeFormat(undefined, { dateStyle: 'short', timeStyle: 'medium' });

export function fmtTime(t) {
  if (!t) return '';
  const d = new Date(parseTime(t));
  return isNaN(d) ? t : timeFormat.format(d);
}

// parseTime reads an RFC 3339 time as milliseconds since the epoch,
// keeping the fraction to the microsecond that Date.parse drops.
export function parseTime(t) {
  const m = /^(.*T\d\d:\d\d:\d\d)(?:\.(\d+))?(Z|[+-]\d\d:\d\d)$/.exec(t || '');
  if (!m) return Date.parse(t);
  const frac = (m[2] || '').padEnd(6, '0').slice(0, 6);
  return Date.parse(m[1] + m[3]) + Number(frac) / 1000;
}

export function fmtDur(ns) {
  const ms = ns / 1e6;
  if (ms < 1) return `${Math.round(ns / 1e3)} µs`;
  if (ms < 1000) return `${ms.toFixed(ms < 10 ? 1 : 0)} ms`;
  const sec = ms / 1000;
  if (sec < 120) return `${sec.toFixed(1)} s`;
  return `${Math.floor(sec / 60)} min ${Math.round(sec % 60)} s`;
}

export function fmtUSD(x) {
  return x ? `$${x.toFixed(x < 0.01 ? 6 : 4)}` : '$0';
}

export function json(v) {
  return JSON.stringify(v, null, 2);
}

// errorText says what a failed call means for a person.
export function errorText(e) {
  if (e && e.code !== undefined) return `${e.message} (code ${e.code})`;
  return String((e && e.message) || e);
}

// alertBox is where a form reports its outcome.
export function alertBox() {
  return h('p', { class: 'alert', role: 'alert' });
}

export function say(box, text, ok) {
  box.textContent = text;
  box.dataset.kind = ok ? 'ok' : 'error';
}

// table builds a table with a caption, header cells and rows of cells.
export function table(caption, heads, rows, attrs) {
  return h('div', { class: 'scroll' },
    h('table', attrs || {},
      caption ? h('caption', {}, caption) : null,
      h('thead', {}, h('tr', {}, heads.map((x) => h('th', { scope: 'col' }, x)))),
      h('tbody', {}, rows.map((r) => r instanceof Node ? r : h('tr', {}, r.map((c) => h('td', {}, c)))))));
}
