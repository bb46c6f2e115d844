// editor.mjs drives `keel acp` as an editor would, with the official ACP
// TypeScript SDK (@agentclientprotocol/sdk) as the client. The Go test
// (TestTypeScriptEditor) runs it and answers its requests on stdin:
//
//   1. a session whose run calls a tool that the policy asks about: the
//      client allows it (session/request_permission), the turn ends;
//   2. a second prompt, cancelled while the model works (the test says
//      "model busy" when the model is called): stopReason cancelled;
//   3. the client asks for a daemon restart ("restart" / "restarted"),
//      starts a new keel acp and loads the session: its history comes
//      back as session/update; a third prompt goes on from it.
//
// It prints "ok" last when every check passed.
import { spawn } from "node:child_process";
import { createInterface } from "node:readline";
import { Readable, Writable } from "node:stream";
import * as acp from "@agentclientprotocol/sdk";

const command = JSON.parse(process.env.KEEL_ACP_COMMAND);
const cwd = process.env.KEEL_ACP_CWD;
const lines = createInterface({ input: process.stdin })[Symbol.asyncIterator]();

async function expectLine(want) {
  const { value, done } = await lines.next();
  if (done || value !== want) throw new Error(`the test said ${JSON.stringify(value)}, want ${JSON.stringify(want)}`);
}

function check(cond, what, detail) {
  if (!cond) throw new Error(`${what}: ${JSON.stringify(detail, null, 1)}`);
}

// run starts keel acp and runs op with a client connected to it; every
// session/update lands in updates, every permission request in asked.
async function run(op) {
  const child = spawn(command[0], command.slice(1), { stdio: ["pipe", "pipe", "inherit"], env: process.env });
  const exited = new Promise((resolve) => child.on("exit", (code) => resolve(code)));
  const stream = acp.ndJsonStream(Writable.toWeb(child.stdin), Readable.toWeb(child.stdout));
  const updates = [];
  const asked = [];
  const app = acp
    .client({ name: "keel-acp-test" })
    .onNotification("session/update", ({ params }) => {
      updates.push(params.update);
    })
    .onRequest("session/request_permission", ({ params }) => {
      asked.push(params);
      const allow = params.options.find((o) => o.kind === "allow_once");
      return { outcome: { outcome: "selected", optionId: allow.optionId } };
    });
  const result = await app.connectWith(stream, (ctx) => op(ctx, updates, asked));
  child.stdin.end();
  const code = await exited;
  check(code === 0, "keel acp exit code after its stdin closed", code);
  return result;
}

const text = (u, kind) => u.filter((x) => x.sessionUpdate === kind).map((x) => x.content.text).join("");

const sessionId = await run(async (ctx, updates, asked) => {
  const init = await ctx.request("initialize", { protocolVersion: acp.PROTOCOL_VERSION, clientCapabilities: {} });
  check(init.protocolVersion === 1 && init.agentCapabilities.loadSession === true, "initialize", init);
  const { sessionId } = await ctx.request("session/new", { cwd, mcpServers: [] });

  // 1. A tool call, permitted.
  const first = await ctx.request("session/prompt", { sessionId, prompt: [{ type: "text", text: "count words" }] });
  check(first.stopReason === "end_turn", "first prompt's stopReason", first);
  check(asked.length === 1 && asked[0].toolCall.title === "tally" && asked[0].toolCall.kind === "read" && asked[0].toolCall.rawInput.text === "a b c" &&
    asked[0].options.map((o) => o.kind).join() === "allow_once,reject_once", "the permission asked", asked);
  const callId = asked[0].toolCall.toolCallId;
  const statuses = updates.filter((u) => u.toolCallId === callId).map((u) => u.status);
  check(statuses[0] === "pending" && statuses.at(-1) === "completed" && statuses.includes("in_progress"), "the call's statuses", updates);
  const done = updates.find((u) => u.toolCallId === callId && u.status === "completed");
  check(done.content[0].content.text.includes('"words":3'), "the call's output", done);
  check(text(updates, "agent_message_chunk") === "3 words", "the answer", updates);

  // 2. A prompt cancelled mid-turn.
  updates.length = 0;
  const second = ctx.request("session/prompt", { sessionId, prompt: [{ type: "text", text: "and again" }] });
  await expectLine("model busy");
  await ctx.notify("session/cancel", { sessionId });
  const r2 = await second;
  check(r2.stopReason === "cancelled", "second prompt's stopReason", r2);
  return sessionId;
});

// 3. The daemon restarts; the session is loaded and goes on.
console.log("restart");
await expectLine("restarted");
await run(async (ctx, updates) => {
  await ctx.request("initialize", { protocolVersion: acp.PROTOCOL_VERSION, clientCapabilities: {} });
  await ctx.request("session/load", { sessionId, cwd, mcpServers: [] });
  check(text(updates, "user_message_chunk") === "count wordsand again", "the history's user messages", updates);
  check(text(updates, "agent_message_chunk") === "3 words", "the history's answers", updates);
  const calls = updates.filter((u) => u.sessionUpdate === "tool_call");
  check(calls.length === 1 && calls[0].title === "tally" && calls[0].kind === "read", "the history's tool calls", updates);
  check(updates.some((u) => u.sessionUpdate === "tool_call_update" && u.toolCallId === calls[0].toolCallId && u.status === "completed"),
    "the history's tool result", updates);
  updates.length = 0;
  const third = await ctx.request("session/prompt", { sessionId, prompt: [{ type: "text", text: "one more" }] });
  check(third.stopReason === "end_turn" && text(updates, "agent_message_chunk") === "after restart", "the prompt after loading", { third, updates });
});
console.log("ok");
process.exit(0); // stdin, the test's channel, would keep it alive
