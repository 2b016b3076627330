// The real @ag-ui/client HttpAgent against a live perdure daemon: a run with a tool
// call and an approval (an interrupt answered by the next run's resume entries),
// the daemon SIGKILLed mid-stream and restarted, the client running the same runId
// again; the agent's messages must equal the log's transcript.
import { test } from "node:test";
import assert from "node:assert/strict";
import { HttpAgent, buildResumeArray } from "@ag-ui/client";
import { Daemon, transcriptItems } from "./support/daemon.mjs";

const SCRIPT = [
  {
    text: "Looking up the current release before deploying anything.",
    tool_uses: [{ name: "slow_lookup", input: { query: "release", seconds: 1.5 } }],
  },
  { text: "Release found. Deploying now.", tool_uses: [{ name: "deploy", input: { target: "prod" } }] },
  { text: "Deployed: all done." },
];

// @ag-ui/client 1.0.0 rethrows the error of cancelling a reader whose connection
// died (an unhandled rejection that would fail any test that kills a server). So a
// connection that dies ends the body here instead; the client then reports a run
// that stopped before RUN_FINISHED, which is what happened.
async function fetchEndingOnDrop(url, init) {
  const resp = await fetch(url, init);
  if (!resp.body) return resp;
  const reader = resp.body.getReader();
  const body = new ReadableStream({
    async pull(controller) {
      try {
        const { done, value } = await reader.read();
        if (done) controller.close();
        else controller.enqueue(value);
      } catch {
        controller.close();
      }
    },
    cancel: (reason) => reader.cancel(reason).catch(() => {}),
  });
  return new Response(body, { status: resp.status, headers: resp.headers });
}

function agentFor(daemon, sid) {
  return new HttpAgent({
    url: `${daemon.url}/v1/sessions/${sid}/ag-ui`,
    headers: daemon.headers(),
    fetch: fetchEndingOnDrop,
    threadId: sid,
    initialMessages: [{ id: "u-1", role: "user", content: "Deploy the release" }],
  });
}

// What the agent's messages show: assistant text, tool calls, tool results.
function shown(messages) {
  const items = [];
  for (const m of messages) {
    if (m.role === "assistant") {
      if (m.content) items.push({ text: m.content });
      for (const c of m.toolCalls ?? []) {
        items.push({ call: c.id, name: c.function.name, input: JSON.parse(c.function.arguments) });
      }
    }
    if (m.role === "tool") items.push({ result: m.toolCallId, output: m.content });
  }
  return items;
}

test("AG-UI HttpAgent: an interrupt for approval, a SIGKILL mid-stream, the same run again", async () => {
  const daemon = await new Daemon(SCRIPT).start();
  const sid = "js-agui";
  try {
    let killed;
    const cut = [];
    const first = agentFor(daemon, sid);
    await first.runAgent(
      { runId: "run-1" },
      {
        onEvent: ({ event }) => {
          cut.push(event.type);
          if (event.type === "TOOL_CALL_END" && !killed) killed = daemon.kill();
        },
      },
    );
    await killed;
    // The connection died with the daemon: the run's stream stopped mid-way.
    assert.ok(cut.includes("TOOL_CALL_END"));
    assert.ok(!cut.includes("RUN_FINISHED"), cut.join());

    await daemon.start();
    // The client runs the same runId again: the same submission, replayed from the log.
    const second = agentFor(daemon, sid);
    const seen = [];
    await second.runAgent({ runId: "run-1" }, { onEvent: ({ event }) => seen.push(event) });
    const customs = seen.filter((e) => e.type === "CUSTOM").map((e) => e.name);
    assert.ok(customs.includes("perdure.restart"), customs.join());
    assert.ok(customs.includes("perdure.recovery"), customs.join());
    assert.equal(second.pendingInterrupts.length, 1);
    const [interrupt] = second.pendingInterrupts;
    assert.equal(interrupt.reason, "tool_approval");
    assert.equal(interrupt.toolCallId, "toolu_002_1");

    const resume = buildResumeArray(second.pendingInterrupts, {
      [interrupt.id]: { status: "resolved", payload: { approved: true } },
    });
    const { result } = await second.runAgent({ runId: "run-2", resume });
    assert.equal(result.final_text, "Deployed: all done.");
    assert.equal(second.pendingInterrupts.length, 0);

    const items = await transcriptItems(daemon, sid);
    assert.deepEqual(shown(second.messages), items);
    const ids = second.messages.map((m) => m.id);
    assert.equal(new Set(ids).size, ids.length, "no message twice");
    await daemon.stop();
    const checked = await daemon.check();
    assert.equal(checked.code, 0, checked.output);
  } finally {
    await daemon.stop();
  }
});
