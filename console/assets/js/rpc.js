// The connection to the daemon: keel's JSON-RPC 2.0 protocol over one
// WebSocket (docs/protocol.md). The session cookie set at login
// authorizes it; the page never sees a token. When the connection drops
// it reconnects with backoff and subscribes again to every run it
// followed, after the last seq it saw, so no event is missed or repeated.
// On every connection it also calls runs.subscribe, so that pages hear
// of new runs and changes of state (runs.changed) instead of polling:
// an idle page sends nothing and runs no timer.

const meta = (name) => document.querySelector(`meta[name="${name}"]`).content;

export const WS_PATH = meta('keel-ws-path');
export const SUBPROTOCOL = meta('keel-subprotocol');
export const STATUS_PATH = meta('keel-status-path');

// RPCError is a JSON-RPC error answer: code, message and data as sent.
export class RPCError extends Error {
  constructor(err) {
    super(err.message);
    this.code = err.code;
    this.data = err.data;
  }
}

// Conn states, shown to the user: connecting, open, lost (it was open;
// retrying), login (not logged in, or the session ended), refused (this
// page's origin is not allowed), down (the daemon does not answer).
export class Conn extends EventTarget {
  constructor(url) {
    super();
    this.url = url || `ws://${location.host}${WS_PATH}`;
    this.state = 'connecting';
    this.nextID = 1;
    this.pending = new Map(); // id -> {resolve, reject}
    this.subs = new Map(); // run id -> {after, onEvent}
    this.backoff = 250;
    this.everOpen = false;
    this.failures = 0;
    this.opens = 0; // connections opened, reconnections included
    this.runsOn = false; // runs.subscribe answered on this connection
  }

  start() { this.connect(); }

  connect() {
    if (this.failures === 0) this.setState('connecting'); // else the last failure stays shown
    let ws;
    try {
      ws = new WebSocket(this.url, [SUBPROTOCOL]);
    } catch (e) {
      this.lost(String(e));
      return;
    }
    this.ws = ws;
    ws.onopen = () => {
      this.backoff = 250;
      this.failures = 0;
      this.everOpen = true;
      this.opens++;
      this.setState('open');
      this.call('initialize', { client: 'keel-console' }).catch(() => {});
      this.call('runs.subscribe').then(() => {
        if (this.ws !== ws) return;
        this.runsOn = true;
        this.dispatchEvent(new CustomEvent('runs.ready'));
      }).catch(() => {});
      for (const [run, s] of this.subs) this.sendSubscribe(run, s);
    };
    ws.onmessage = (m) => this.receive(m.data, performance.now());
    ws.onclose = (ev) => {
      if (this.ws !== ws) return;
      this.ws = null;
      this.runsOn = false;
      for (const p of this.pending.values()) p.reject(new Error('connection lost'));
      this.pending.clear();
      this.lost(ev.reason);
    };
  }

  // lost schedules a reconnect. A handshake the daemon refuses closes
  // like a daemon that is down (1006, no reason), so the status endpoint
  // says which it is: 401 login, 403 refused, no answer down.
  async lost(reason) {
    this.failures++;
    const wait = this.backoff;
    this.backoff = Math.min(this.backoff * 2, 10000);
    this.reason = reason || '';
    clearTimeout(this.timer);
    this.timer = setTimeout(() => this.connect(), wait);
    let state = 'down';
    try {
      const res = await fetch(STATUS_PATH, { cache: 'no-store' });
      if (res.status === 401) state = 'login';
      else if (res.status === 403) state = 'refused';
      else if (res.ok) state = 'lost'; // logged in: the connection itself broke
    } catch { /* the daemon does not answer */ }
    if (this.ws) return; // reconnected meanwhile
    this.setState(state, wait);
  }

  setState(state, retryIn) {
    this.state = state;
    this.retryIn = retryIn;
    this.dispatchEvent(new CustomEvent('state', { detail: { state, retryIn, reason: this.reason } }));
  }

  // receive handles one frame; at is when it arrived (performance.now()),
  // passed on to the run's handler with each event.
  receive(text, at) {
    let msg;
    try { msg = JSON.parse(text); } catch { return; }
    if (msg.id !== undefined && msg.id !== null && (msg.result !== undefined || msg.error)) {
      const p = this.pending.get(msg.id);
      if (!p) return;
      this.pending.delete(msg.id);
      if (msg.error) p.reject(new RPCError(msg.error));
      else p.resolve(msg.result);
      return;
    }
    if (msg.method === 'run.event') {
      const ev = msg.params;
      const s = this.subs.get(ev.run_id);
      // Until its run.subscribe is answered, an event of the run belongs
      // to an earlier subscription (of a page just left): the server
      // answers a subscription before its first event.
      if (!s || !s.ready) return;
      if (ev.seq > 0) {
        if (ev.seq <= s.after) return; // already seen before a reconnect
        s.after = ev.seq;
      }
      s.onEvent(ev, at);
    } else if (msg.method) {
      this.dispatchEvent(new CustomEvent(msg.method, { detail: msg.params }));
    }
  }

  // call sends a request and resolves with its result, or rejects with
  // an RPCError (or an Error when the connection is not open).
  call(method, params) {
    if (!this.ws || this.ws.readyState !== WebSocket.OPEN) {
      return Promise.reject(new Error('not connected'));
    }
    const id = this.nextID++;
    const req = { jsonrpc: '2.0', id, method };
    if (params !== undefined) req.params = params;
    return new Promise((resolve, reject) => {
      this.pending.set(id, { resolve, reject });
      this.ws.send(JSON.stringify(req));
    });
  }

  // subscribe follows a run's events after seq `after` (0: all), now and
  // after every reconnect; it returns the function that stops following.
  subscribe(run, after, onEvent) {
    const s = { after, onEvent };
    this.subs.set(run, s);
    if (this.state === 'open') this.sendSubscribe(run, s);
    return () => {
      if (this.subs.get(run) !== s) return;
      this.subs.delete(run);
      this.call('run.unsubscribe', { run_id: run }).catch(() => {});
    };
  }

  sendSubscribe(run, s) {
    s.ready = false;
    this.call('run.subscribe', { run_id: run, after_seq: s.after }).then(() => {
      if (this.subs.get(run) === s) s.ready = true;
    }, async (e) => {
      if (this.subs.get(run) !== s) return;
      // A page that just stopped following this run may have its
      // unsubscribe still in flight: requests run concurrently.
      if (e.code === -32002 && !s.retried) {
        s.retried = true;
        await this.call('run.unsubscribe', { run_id: run }).catch(() => {});
        this.sendSubscribe(run, s);
      } else if (s.onError) {
        s.onError(e);
      }
    });
  }
}

// watchRuns keeps a page's list of runs current: onReady runs once the
// connection follows run changes (now, if it already does, and after
// every reconnect), which is when the page reads its list (run.list);
// onChanged runs with each runs.changed summary. It returns the
// function that stops both.
export function watchRuns(conn, onReady, onChanged) {
  const ready = () => onReady();
  const changed = (e) => onChanged(e.detail);
  conn.addEventListener('runs.ready', ready);
  conn.addEventListener('runs.changed', changed);
  if (conn.runsOn) onReady();
  return () => {
    conn.removeEventListener('runs.ready', ready);
    conn.removeEventListener('runs.changed', changed);
  };
}

// newer reports whether summary b of a run should replace a: a
// runs.changed read before a run.list may arrive after it.
export function newer(a, b) {
  return !a || (b.last_seq || 0) >= (a.last_seq || 0);
}
