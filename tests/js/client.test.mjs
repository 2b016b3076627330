// @ts-check
// The TypeScript client a frontend would generate from the daemon's /openapi.json:
// types from openapi-typescript (generated/perdure-api.d.ts, which
// tests/server/test_js_clients.py writes from the current code before the suite
// runs) and openapi-fetch as the HTTP client. `tsc` type-checks this file against
// those types first, so a route or a field the document does not have fails it. Against a live daemon: create a
// session, submit, read the native event stream until the approval is asked, approve,
// and follow the stream until the run finishes.
import { test } from "node:test";
import assert from "node:assert/strict";
import createClient from "openapi-fetch";
import { Daemon } from "./support/daemon.mjs";

/** @typedef {import("./generated/perdure-api.js").paths} Paths */

const SCRIPT = [
  { text: "Deploying to production.", tool_uses: [{ name: "deploy", input: { target: "prod" } }] },
  { text: "Deployed." },
];

/**
 * The native stream's events, parsed from Server-Sent Events.
 * @param {ReadableStream<Uint8Array>} body
 * @returns {AsyncGenerator<{id?: string, event?: string, data: any}>}
 */
async function* sseEvents(body) {
  const decoder = new TextDecoder();
  let buffer = "";
  for await (const chunk of /** @type {AsyncIterable<Uint8Array>} */ (/** @type {unknown} */ (body))) {
    buffer += decoder.decode(chunk, { stream: true });
    let end;
    while ((end = buffer.indexOf("\n\n")) >= 0) {
      const frame = buffer.slice(0, end);
      buffer = buffer.slice(end + 2);
      /** @type {{id?: string, event?: string, data?: string}} */
      const fields = {};
      for (const line of frame.split("\n")) {
        if (!line || line.startsWith(":")) continue;
        const at = line.indexOf(":");
        const name = line.slice(0, at);
        const value = line.slice(at + 1).replace(/^ /, "");
        if (name === "id" || name === "event" || name === "data") fields[name] = value;
      }
      if (fields.data !== undefined) yield { id: fields.id, event: fields.event, data: JSON.parse(fields.data) };
    }
  }
}

test("the generated client: create, submit, approve and the native event stream", async () => {
  const daemon = await new Daemon(SCRIPT).start();
  try {
    /** @type {import("openapi-fetch").Client<Paths>} */
    const api = createClient({ baseUrl: daemon.url, headers: daemon.headers() });

    const created = await api.POST("/v1/sessions", { body: { session_id: "ts-client" } });
    assert.equal(created.response.status, 201);
    assert.deepEqual(created.data, { session_id: "ts-client", created: true });
    const session = { path: { session_id: "ts-client" } };

    const submitted = await api.POST("/v1/sessions/{session_id}/messages", {
      params: session,
      body: { text: "Deploy to production, please.", request_id: "ts-submit-1" },
    });
    assert.equal(submitted.response.status, 202);
    assert.equal(submitted.data?.duplicate, false);

    // A typed error: the same request id with another body is a documented 409.
    const clash = await api.POST("/v1/sessions/{session_id}/messages", {
      params: session,
      body: { text: "Something else.", request_id: "ts-submit-1" },
    });
    assert.equal(clash.response.status, 409);
    assert.equal(clash.error?.error.code, "conflict");

    const stream = await api.GET("/v1/sessions/{session_id}/events", {
      params: { ...session, query: { format: "perdure" } },
      parseAs: "stream",
    });
    assert.equal(stream.response.status, 200);
    assert.match(stream.response.headers.get("content-type") ?? "", /^text\/event-stream/);
    assert.ok(stream.data, "the stream has a body");

    const seen = [];
    let approved = false;
    for await (const event of sseEvents(stream.data)) {
      if (event.id === undefined) continue; // ephemeral deltas
      assert.equal(String(event.data.seq), event.id);
      seen.push(event.event);
      if (event.event === "ToolAwaitingApproval" && !approved) {
        const callId = event.data.record.call_id;
        const answer = await api.POST("/v1/sessions/{session_id}/approvals/{call_id}", {
          params: { path: { session_id: "ts-client", call_id: callId } },
          body: { approved: true, request_id: "ts-approve-1", note: "from the TS client" },
        });
        assert.equal(answer.response.status, 200);
        assert.equal(answer.data?.approved, true);
        assert.equal(answer.data?.call_id, callId);
        approved = true;
      }
      if (event.event === "RunFinished") break;
    }
    assert.ok(approved, `no approval was asked: ${seen.join(", ")}`);
    for (const kind of ["SessionCreated", "InputAccepted", "ToolAwaitingApproval", "ApprovalDecided", "ToolCompleted", "RunFinished"]) {
      assert.ok(seen.includes(kind), `${kind} missing from ${seen.join(", ")}`);
    }

    const state = await api.GET("/v1/sessions/{session_id}", { params: session });
    assert.equal(state.data?.pending_approvals.length, 0);
  } finally {
    await daemon.stop();
  }
  const checked = await daemon.check();
  assert.equal(checked.code, 0, checked.output);
});
