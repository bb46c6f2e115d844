// LangGraph.js side of keel's durable-step benchmark (go run ./bench/durable).
//
// It builds a StateGraph of N deterministic nodes in a chain (each adds one
// to a counter in the state; no model), compiled with SqliteSaver on a
// better-sqlite3 database that this script opens itself, so that the
// durability settings are explicit: journal_mode=WAL (what the saver sets
// too) and synchronous=FULL or NORMAL from the command line. Graphs run
// with durability "sync" unless told otherwise: each step's checkpoint is
// committed before the next step starts, as keel journals each step before
// it goes on.
//
// A durable step is one node whose checkpoint has been committed: the
// saver is wrapped to count the checkpoints of steps 1..N (LangGraph also
// writes one for the input, step -1, and one for the start node, step 0).
//
// It measures, each on a fresh database file in --dir and after one
// untimed run on it:
//
//   - unless --skip-single, one run (one thread_id) of N steps: time per
//     durable step (total / N), the median of 5 runs made one after the
//     other; and, untimed, one run with better-sqlite3's
//     verbose hook on, to count the SQLite write transactions LangGraph
//     commits per step;
//   - for each C in --c, C runs with distinct thread_ids started together
//     (Promise.all), N steps each: durable steps per second overall.
//
// It prints one JSON object on stdout and nothing else.
//
//	node bench.mjs --dir DIR [--sync FULL|NORMAL] [--n 50] [--c 100,1000] [--skip-single]
import { mkdirSync, readFileSync } from "node:fs";
import { join } from "node:path";
import { parseArgs } from "node:util";

import Database from "better-sqlite3";
import { Annotation, END, START, StateGraph } from "@langchain/langgraph";
import { SqliteSaver } from "@langchain/langgraph-checkpoint-sqlite";

const { values: args } = parseArgs({
  options: {
    dir: { type: "string" },
    sync: { type: "string", default: "FULL" },
    n: { type: "string", default: "50" },
    c: { type: "string", default: "100" },
    durability: { type: "string", default: "sync" },
    "skip-single": { type: "boolean", default: false },
  },
});
if (!args.dir) fail("--dir is required");
const sync = args.sync.toUpperCase();
if (sync !== "FULL" && sync !== "NORMAL") fail(`--sync ${args.sync}: want FULL or NORMAL`);
const n = Number(args.n);
if (!Number.isInteger(n) || n < 1) fail(`--n ${args.n}: want a positive integer`);
const concurrency = args.c === "" ? [] : args.c.split(",").map(Number);
if (concurrency.some((c) => !Number.isInteger(c) || c < 1)) fail(`--c ${args.c}: want a comma-separated list of positive integers`);
mkdirSync(args.dir, { recursive: true });

function fail(msg) {
  process.stderr.write(`bench.mjs: ${msg}\n`);
  process.exit(2);
}

// version reads an installed package's version from its package.json.
function version(pkg) {
  const url = new URL(`./node_modules/${pkg}/package.json`, import.meta.url);
  return JSON.parse(readFileSync(url, "utf8")).version;
}

// CountingSaver is SqliteSaver counting the durable steps it committed.
class CountingSaver extends SqliteSaver {
  steps = 0;

  async put(config, checkpoint, metadata) {
    const out = await super.put(config, checkpoint, metadata);
    if (metadata?.step >= 1) this.steps++;
    return out;
  }
}

// open opens a fresh database file with the durability settings under
// test. verbose, when given, is called with every SQL statement run.
let files = 0;
function open(verbose) {
  const file = join(args.dir, `langgraph-${sync.toLowerCase()}-${process.pid}-${files++}.db`);
  const db = new Database(file, verbose ? { verbose } : {});
  db.pragma("journal_mode = WAL");
  db.pragma(`synchronous = ${sync}`);
  return db;
}

// graph compiles the N-node chain with a counting saver on db.
function graph(db) {
  const State = Annotation.Root({
    count: Annotation({ reducer: (_, b) => b, default: () => 0 }),
  });
  const g = new StateGraph(State);
  let prev = START;
  for (let i = 1; i <= n; i++) {
    const name = `step${i}`;
    g.addNode(name, (s) => ({ count: s.count + 1 }));
    g.addEdge(prev, name);
    prev = name;
  }
  g.addEdge(prev, END);
  const saver = new CountingSaver(db);
  return { app: g.compile({ checkpointer: saver }), saver };
}

// invoke runs the graph to its end on one thread and checks the result.
async function invoke(app, thread) {
  const out = await app.invoke(
    { count: 0 },
    { configurable: { thread_id: thread }, recursionLimit: n + 10, durability: args.durability },
  );
  if (out.count !== n) throw new Error(`thread ${thread}: count ${out.count}, want ${n}`);
}

// measure runs c threads of the graph together on a fresh database, after
// one untimed run on it, and checks that every step was checkpointed.
async function measure(c) {
  const db = open();
  try {
    const { app, saver } = graph(db);
    await invoke(app, "warmup");
    saver.steps = 0;
    const start = performance.now();
    await Promise.all(Array.from({ length: c }, (_, i) => invoke(app, `thread-${i}`)));
    const ms = performance.now() - start;
    if (saver.steps !== c * n) throw new Error(`${c} runs of ${n} steps committed ${saver.steps} step checkpoints`);
    return { c, steps: saver.steps, total_ms: ms, steps_per_s: saver.steps / (ms / 1000) };
  } finally {
    db.close();
  }
}

// measureOne runs reps threads one after the other on a fresh database,
// after one untimed run on it, and returns the median time of one.
async function measureOne(reps) {
  const db = open();
  try {
    const { app } = graph(db);
    await invoke(app, "warmup");
    const ms = [];
    for (let i = 0; i < reps; i++) {
      const start = performance.now();
      await invoke(app, `one-${i}`);
      ms.push(performance.now() - start);
    }
    return ms.sort((a, b) => a - b)[Math.floor(reps / 2)];
  } finally {
    db.close();
  }
}

// countTransactions runs one thread with the verbose hook and counts
// committed write transactions: explicit BEGIN…COMMIT blocks, and writes
// outside them (SQLite's autocommit makes each its own transaction).
async function countTransactions() {
  let inTx = false;
  const counts = { commits: 0, statements: 0 };
  const db = open((sql) => {
    const s = sql.trimStart().toUpperCase();
    counts.statements++;
    if (s.startsWith("BEGIN")) inTx = true;
    else if (s.startsWith("COMMIT") || s.startsWith("END")) {
      inTx = false;
      counts.commits++;
    } else if (!inTx && /^(INSERT|UPDATE|DELETE|REPLACE)\b/.test(s)) counts.commits++;
  });
  try {
    const { app } = graph(db);
    await invoke(app, "warmup"); // creates the tables and prepares statements
    counts.commits = counts.statements = 0;
    await invoke(app, "probe");
    const rows = (table) => db.prepare(`SELECT count(*) AS k FROM ${table} WHERE thread_id = 'probe'`).get().k;
    return {
      commits_per_step: counts.commits / n,
      statements_per_step: counts.statements / n,
      checkpoint_rows: rows("checkpoints"),
      write_rows: rows("writes"),
    };
  } finally {
    db.close();
  }
}

const probe = open();
const settings = {
  journal_mode: probe.pragma("journal_mode", { simple: true }),
  synchronous: ["OFF", "NORMAL", "FULL", "EXTRA"][probe.pragma("synchronous", { simple: true })],
  sqlite: probe.prepare("SELECT sqlite_version() AS v").get().v,
};
probe.close();

const result = {
  versions: {
    node: process.versions.node,
    "@langchain/langgraph": version("@langchain/langgraph"),
    "@langchain/langgraph-checkpoint-sqlite": version("@langchain/langgraph-checkpoint-sqlite"),
    "better-sqlite3": version("better-sqlite3"),
    sqlite: settings.sqlite,
  },
  journal_mode: settings.journal_mode,
  synchronous: settings.synchronous,
  durability: args.durability,
  n,
  concurrent: [],
};
if (!args["skip-single"]) {
  const ms = await measureOne(5);
  result.single = { total_ms: ms, ms_per_step: ms / n };
  result.transactions = await countTransactions();
}
for (const c of concurrency) result.concurrent.push(await measure(c));
process.stdout.write(JSON.stringify(result) + "\n");
