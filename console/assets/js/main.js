// The console's entry: one connection, a status line, and a hash router
// (#/runs, #/runs/ID, #/live, #/approvals, #/tools, #/models, #/env).
// A page is a function (conn, root, params) that fills root and returns
// the function that stops it (timers, subscriptions).

import { Conn } from './rpc.js';
import { h, replace } from './dom.js';
import { runsPage } from './runs.js';
import { runPage } from './run.js';
import { livePage } from './live.js';
import { approvalsPage, watchInbox } from './approvals.js';
import { toolsPage } from './tools.js';
import { modelsPage, envPage } from './env.js';

const routes = [
  [/^#\/runs\/([^/?]+)$/, runPage],
  [/^#\/runs(?:\?.*)?$/, runsPage],
  [/^#\/live(?:\?.*)?$/, livePage],
  [/^#\/approvals$/, approvalsPage],
  [/^#\/tools$/, toolsPage],
  [/^#\/models$/, modelsPage],
  [/^#\/env$/, envPage],
];

const conn = new Conn();
const main = document.getElementById('main');
let stop = () => {};

function route() {
  stop();
  const hash = location.hash || '#/runs';
  for (const [re, page] of routes) {
    const m = re.exec(hash);
    if (!m) continue;
    const params = new URLSearchParams(hash.split('?')[1] || '');
    main.replaceChildren();
    stop = page(conn, main, m.slice(1).map(decodeURIComponent), params) || (() => {});
    for (const a of document.querySelectorAll('nav a')) {
      const here = hash.startsWith(a.getAttribute('href'));
      if (here) a.setAttribute('aria-current', 'page'); else a.removeAttribute('aria-current');
    }
    return;
  }
  replace(main, h('h1', {}, 'Not found'), h('p', {}, 'No page here. ', h('a', { href: '#/runs' }, 'See the runs.')));
  stop = () => {};
}

const connLine = document.getElementById('conn');
conn.addEventListener('state', (e) => {
  const { state, retryIn } = e.detail;
  connLine.dataset.state = state;
  const secs = Math.max(1, Math.round((retryIn || 0) / 1000));
  switch (state) {
    case 'open':
      replace(connLine, 'Connected');
      break;
    case 'connecting':
      replace(connLine, 'Connecting…');
      break;
    case 'lost':
      replace(connLine, `Connection lost; reconnecting in ${secs} s.`);
      break;
    case 'login':
      replace(connLine, 'Not logged in (or the session ended, or the daemon restarted). Run ',
        h('code', {}, 'keel open'), ' in a terminal and open the link it prints.');
      break;
    case 'refused':
      replace(connLine, 'The daemon refuses this page\'s origin. Open the console at the address ',
        h('code', {}, 'keel open'), ' prints.');
      break;
    case 'down':
      replace(connLine, 'The keel daemon does not answer: is it running? Start it with ',
        h('code', {}, 'keel daemon'), `; retrying in ${secs} s.`);
      break;
  }
});

window.addEventListener('hashchange', route);
conn.start();
watchInbox(conn, document.getElementById('inbox-count'));
route();
// For tests and benchmarks: the connection and its state.
window.keelConsole = { conn };
