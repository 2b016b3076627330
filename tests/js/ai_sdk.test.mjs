// The real `ai` package's chat client (AbstractChat + DefaultChatTransport, the
// code useChat runs) against a live perdure daemon: a run with a tool call and an
// approval, the daemon SIGKILLed mid-stream and restarted, the client resuming;
// the final message must equal the log's transcript, no part missing or twice.
import { test } from "node:test";
import assert from "node:assert/strict";
import {
  AbstractChat,
  DefaultChatTransport,
  lastAssistantMessageIsCompleteWithApprovalResponses,
  parseJsonEventStream,
  readUIMessageStream,
  uiMessageChunkSchema,
} from "ai";
import { Daemon, waiter, transcriptItems } from "./support/daemon.mjs";

const SCRIPT = [
  {
    text: "Looking up the current release before deploying anything.",
    tool_uses: [{ name: "slow_lookup", input: { query: "release", seconds: 1.5 } }],
  },
  { text: "Release found. Deploying now.", tool_uses: [{ name: "deploy", input: { target: "prod" } }] },
  { text: "Deployed: all done." },
];

// ChatState the way a UI framework keeps it (immutable arrays), telling the test
// whenever something changed.
class State {
  constructor(changed) {
    this.changed = changed;
    this._status = "ready";
    this.error = undefined;
    this.messages = [];
  }
  get status() { return this._status; }
  set status(value) { this._status = value; this.changed.poke(); }
  pushMessage = (m) => { this.messages = [...this.messages, m]; this.changed.poke(); };
  popMessage = () => { this.messages = this.messages.slice(0, -1); this.changed.poke(); };
  replaceMessage = (i, m) => {
    this.messages = [...this.messages.slice(0, i), m, ...this.messages.slice(i + 1)];
    this.changed.poke();
  };
  snapshot = (thing) => structuredClone(thing);
}

class Chat extends AbstractChat {
  constructor({ changed, ...init }) {
    super({ ...init, state: new State(changed) });
  }
}

const reply = (chat) => chat.messages.findLast((m) => m.role === "assistant");
const parts = (chat) => reply(chat)?.parts ?? [];
const toolPart = (chat, name) => parts(chat).find((p) => p.type === "dynamic-tool" && p.toolName === name);

test("useChat's client: a run with an approval survives a SIGKILL mid-stream", async () => {
  const daemon = await new Daemon(SCRIPT).start();
  const sid = "js-chat";
  const changed = waiter();
  const errors = [];
  try {
    const chat = new Chat({
      id: sid,
      changed,
      transport: new DefaultChatTransport({
        api: `${daemon.url}/v1/sessions/${sid}/chat`,
        headers: () => daemon.headers(),
      }),
      sendAutomaticallyWhen: lastAssistantMessageIsCompleteWithApprovalResponses,
      onError: (error) => errors.push(error),
    });

    const sending = chat.sendMessage({ text: "Deploy the release" });
    await changed.until(() => toolPart(chat, "slow_lookup")?.state === "input-available", "the slow lookup");
    const before = structuredClone(reply(chat));
    assert.ok(before.parts.some((p) => p.type === "text" && p.text.startsWith("Looking up")));

    await daemon.kill(); // mid-stream: the lookup is running
    await sending;
    assert.equal(chat.status, "error");
    assert.ok(errors.length >= 1);

    await daemon.start();
    await chat.resumeStream(); // replays the reply from the log, up to the approval
    assert.equal(chat.status, "ready");
    const deploy = toolPart(chat, "deploy");
    assert.equal(deploy.state, "approval-requested");
    assert.equal(reply(chat).id, before.id, "the replay replaced the message, not added one");
    assert.equal(chat.messages.length, 2);

    await chat.addToolApprovalResponse({ id: deploy.approval.id, approved: true });
    await changed.until(
      () => chat.status === "ready" && parts(chat).some((p) => p.type === "text" && p.text === "Deployed: all done."),
      "the final answer",
    );

    // The final message, as a chat UI shows it, equals the log's transcript.
    const shown = [];
    const outputs = {};
    for (const p of parts(chat)) {
      if (p.type === "text") shown.push({ text: p.text });
      if (p.type === "dynamic-tool") {
        shown.push({ call: p.toolCallId, name: p.toolName, input: p.input });
        assert.equal(p.state, "output-available", `${p.toolName} finished`);
        outputs[p.toolCallId] = p.output;
      }
    }
    const items = await transcriptItems(daemon, sid);
    assert.deepEqual(shown, items.filter((i) => !("result" in i)));
    const results = Object.fromEntries(items.filter((i) => "result" in i).map((i) => [i.result, i.output]));
    assert.deepEqual(outputs, results);
    // perdure's own facts rode along as data parts: the restart and recovery's decision.
    const facts = parts(chat).filter((p) => p.type.startsWith("data-perdure-")).map((p) => p.type);
    assert.ok(facts.includes("data-perdure-restart"), facts.join());
    assert.ok(facts.includes("data-perdure-recovery"), facts.join());
    const steps = parts(chat).filter((p) => p.type === "step-start").length;
    assert.equal(steps, 3);

    // The session's whole stream in the same encoding (read from the log afterwards),
    // parsed by the ai package's own schema and stream reader, ends in the same message.
    const resp = await fetch(`${daemon.url}/v1/sessions/${sid}/events?format=ai-sdk&live=0`, {
      headers: daemon.headers(),
    });
    assert.equal(resp.headers.get("x-vercel-ai-ui-message-stream"), "v1");
    const chunks = parseJsonEventStream({ stream: resp.body, schema: uiMessageChunkSchema })
      .pipeThrough(new TransformStream({
        transform(parsed, controller) {
          assert.ok(parsed.success, `a chunk the ai package rejects: ${JSON.stringify(parsed.rawValue)}`);
          controller.enqueue(parsed.value);
        },
      }));
    let replayed;
    for await (const message of readUIMessageStream({ stream: chunks })) replayed = message;
    const visible = (ps) => ps.filter((p) => p.type === "text" || p.type === "dynamic-tool")
      .map((p) => (p.type === "text" ? p.text : [p.toolCallId, p.state, p.output]));
    assert.equal(replayed.id, reply(chat).id);
    assert.deepEqual(visible(replayed.parts), visible(parts(chat)));
    await daemon.stop();
    const checked = await daemon.check();
    assert.equal(checked.code, 0, checked.output);
  } finally {
    await daemon.stop();
  }
});
