// perdure's web page: sessions, a live transcript per session (with the model's
// reasoning as it streams, and tokens and cost per turn and per run), approvals,
// calls that wait for a person (retry, skip or fail them; applied, not applied or failed
// for one whose outcome is unknown), calls whose outcome is
// unknown (look, or tell the agent), and the undo of completed calls whose tool has
// one (offered where a cancel or a revision lists the call as compensable).
// Plain JS, no build step. Auth rides on the HttpOnly cookie set by GET /?token=...,
// which fetch() and EventSource send by themselves (same origin). The token may be
// the admin token or a scoped one (GET /v1/whoami says which): a scoped page shows
// only its session, and a read-only one offers no buttons.
//
// The transcript is fed by the session's Server-Sent Events: every committed record
// carries `id: seq`, so when the daemon restarts, EventSource reconnects by itself
// with Last-Event-ID and the server replays exactly what was missed (no gap, no
// duplicate). Text deltas are ephemeral (no id): the committed reply replaces them.
"use strict";

const RECORD_TYPES = [
  "SessionCreated", "InputAccepted", "RunStarted", "RunFinished", "GenerationStarted",
  "RetryPending", "GenerationCompleted", "ToolTaskCreated", "ToolAwaitingApproval",
  "ApprovalDecided", "ToolExecuting", "ToolHeartbeat", "AgentStarted", "ToolRetryPending",
  "ToolAwaitingHuman", "ResolutionDecided", "ToolCompleted", "ToolOutcomeUnknown", "ToolCancelled",
  "CancelRequested", "GoalRevised", "SessionPaused", "SessionResumed", "RecoveryDecision",
  "SessionParked", "LogOpened", "CompensationRequested", "CompensationFinished", "SessionForked",
];
const EPHEMERAL_TYPES = [
  "model_call", "thinking_delta", "text_delta", "tool_progress", "session_deleted",
];
const PHASE_LABEL = {
  created: "created", awaiting_approval: "awaiting approval", approved: "approved",
  denied: "denied", executing: "executing", completed: "completed",
  outcome_unknown: "outcome unknown", cancelled: "cancelled",
  retry_pending: "retry pending", awaiting_human: "needs a person",
};
const WAITING_PHASES = ["awaiting_approval", "awaiting_human"]; // phases with buttons

const $ = (sel) => document.querySelector(sel);
const who = { scope: "admin", session_id: null, expires_at: null }; // GET /v1/whoami
const view = {
  sid: null,         // the session shown
  source: null,      // its EventSource
  lastSeq: 0,        // the last committed seq rendered
  gens: new Map(),   // generation_id -> assistant <li>
  calls: new Map(),  // call_id -> tool card element
  compensated: new Set(), // call_ids with a compensation requested
  reopen: null,      // timer for a manual reconnect
  summaryTimer: null,
};

function requestId() {
  const bytes = new Uint8Array(12);
  crypto.getRandomValues(bytes);
  return "web-" + Array.from(bytes, (b) => b.toString(16).padStart(2, "0")).join("");
}

async function api(method, path, body) {
  const init = { method, credentials: "same-origin", headers: {} };
  if (body !== undefined) {
    init.headers["Content-Type"] = "application/json";
    init.body = JSON.stringify(body);
  }
  const resp = await fetch(path, init);
  const data = await resp.json().catch(() => ({}));
  if (resp.status === 401) {
    location.href = "/";
  }
  if (!resp.ok) {
    const err = data.error || { code: "http_" + resp.status, message: resp.statusText };
    throw new Error(err.code + ": " + err.message);
  }
  return data;
}

function el(tag, cls, text) {
  const node = document.createElement(tag);
  if (cls) node.className = cls;
  if (text !== undefined) node.textContent = text;
  return node;
}

function setConn(state, text) {
  const conn = $("#conn");
  conn.dataset.state = state;
  conn.textContent = text;
}

// -- the session list ----------------------------------------------------------------
//
// Newest first, one page at a time (GET /v1/sessions?order=newest: the daemon reads
// only that page's sessions from the log's index by creation, however many the log
// holds). "More" follows the page's `next`; the refresh every few seconds asks for as
// many as are shown, from the newest, in one request.

const LIST_PAGE = 100;
const MAX_LIST = 10000; // the daemon's largest page
const sessionList = { shown: LIST_PAGE, next: null, loading: false };

async function loadSessions() {
  if (who.scope !== "admin") return; // a scoped token sees its own session only
  if (sessionList.loading) return; // a page is on its way: it shows the list as it is
  sessionList.loading = true;
  try {
    const limit = Math.min(sessionList.shown, MAX_LIST);
    const data = await api("GET", `/v1/sessions?order=newest&limit=${limit}`);
    $("#sessions").replaceChildren();
    showSessions(data);
    if (!view.source) setConn("live", "connected");
  } catch (e) {
    if (!view.source) setConn("reconnecting", "daemon unreachable, retrying…");
  } finally {
    sessionList.loading = false;
  }
}

async function moreSessions() {
  if (sessionList.next === null || sessionList.loading) return;
  sessionList.loading = true;
  const before = encodeURIComponent(sessionList.next);
  try {
    const data = await api("GET", `/v1/sessions?order=newest&limit=${LIST_PAGE}&before=${before}`);
    sessionList.shown = Math.min(sessionList.shown + LIST_PAGE, MAX_LIST);
    showSessions(data);
  } catch (e) {
    if (!view.source) setConn("reconnecting", "daemon unreachable, retrying…");
  } finally {
    sessionList.loading = false;
  }
}

function showSessions(data) {
  const list = $("#sessions");
  const more = list.querySelector("li.more");
  if (more) more.remove();
  for (const s of data.sessions) {
    const li = el("li");
    li.dataset.sid = s.session_id;
    li.append(el("span", "", s.session_id));
    if (s.stuck) {
      // Unfinished work and nothing committed for the daemon's --stuck-after seconds.
      const mark = el("span", "stuck", `stuck: ${s.stuck.describe}`);
      mark.title = `no progress for ${Math.round(s.stuck.idle_for)} s`;
      li.append(mark);
    } else if (s.active) li.append(el("span", "active", "active"));
    if (s.session_id === view.sid) li.classList.add("selected");
    li.addEventListener("click", () => openSession(s.session_id));
    list.append(li);
  }
  sessionList.next = data.next;
  if (data.next !== null && list.children.length < MAX_LIST) {
    const li = el("li", "more");
    const button = el("button", "", "More");
    button.type = "button";
    button.addEventListener("click", moreSessions);
    li.append(button);
    list.append(li);
  }
}

// -- one session -------------------------------------------------------------------------

function openSession(sid) {
  if (view.source) view.source.close();
  clearTimeout(view.reopen);
  Object.assign(view, {
    sid, source: null, lastSeq: 0, gens: new Map(), calls: new Map(), compensated: new Set(),
  });
  location.hash = encodeURIComponent(sid);
  $("#empty").hidden = true;
  $("#session-view").hidden = false;
  $("#sid").textContent = sid;
  $("#transcript").replaceChildren();
  $("#summary").replaceChildren();
  for (const li of document.querySelectorAll("#sessions li")) {
    li.classList.toggle("selected", li.dataset.sid === sid);
  }
  connect(0);
  refreshSummary();
}

function connect(after) {
  const sid = view.sid;
  const url = `/v1/sessions/${encodeURIComponent(sid)}/events?after=${after}`;
  const source = new EventSource(url);
  view.source = source;
  source.onopen = () => setConn("live", "live");
  source.onerror = () => {
    if (view.source !== source) return;
    setConn("reconnecting", "reconnecting…");
    // EventSource retries by itself (sending Last-Event-ID); if the browser gave up
    // (e.g. an error status while the daemon restarted), start over from our last seq.
    if (source.readyState === EventSource.CLOSED) {
      clearTimeout(view.reopen);
      view.reopen = setTimeout(() => { if (view.sid === sid) connect(view.lastSeq); }, 1500);
    }
  };
  for (const type of RECORD_TYPES) {
    source.addEventListener(type, (ev) => {
      if (view.source !== source) return;
      const msg = JSON.parse(ev.data);
      if (msg.seq <= view.lastSeq) return; // never render a record twice
      view.lastSeq = msg.seq;
      onRecord(type, msg.record, msg.seq);
      scheduleSummary();
    });
  }
  for (const type of EPHEMERAL_TYPES) {
    source.addEventListener(type, (ev) => {
      if (view.source !== source) return;
      onEphemeral(type, JSON.parse(ev.data).data);
    });
  }
}

function streamOpen(timeoutMs) {
  const source = view.source;
  return new Promise((resolve) => {
    if (!source || source.readyState === EventSource.OPEN) return resolve();
    source.addEventListener("open", () => resolve(), { once: true });
    setTimeout(resolve, timeoutMs); // never block the user on it
  });
}

function add(node) {
  const list = $("#transcript");
  const detail = $("#detail");
  const atBottom = detail.scrollHeight - detail.scrollTop - detail.clientHeight < 80;
  list.append(node);
  if (atBottom) detail.scrollTop = detail.scrollHeight;
  return node;
}

function note(cls, text) {
  return add(el("li", cls, text));
}

function assistant(generationId) {
  let li = view.gens.get(generationId);
  if (!li) {
    li = el("li", "assistant");
    li.dataset.generation = generationId;
    const reasoning = el("details", "reasoning");
    reasoning.hidden = true;
    reasoning.append(el("summary", "", "reasoning"), el("div", "thinking"));
    li.append(reasoning, el("div", "text"), el("div", "retry"), el("div", "calls"), el("div", "usage"));
    view.gens.set(generationId, add(li));
  }
  return li;
}

function toolCard(callId, name, input) {
  let card = view.calls.get(callId);
  if (!card) {
    card = el("div", "tool");
    card.dataset.call = callId;
    const head = el("div", "head");
    head.append(el("strong", "", name || "?"), el("span", "phase"), el("span", "muted", callId));
    card.append(head);
    if (input !== undefined) card.append(el("pre", "input", JSON.stringify(input)));
    card.append(el("div", "note"), el("pre", "output"));
    view.calls.set(callId, card);
  }
  return card;
}

function setPhase(callId, phase, detail) {
  const card = view.calls.get(callId);
  if (!card) return;
  card.dataset.phase = phase;
  card.querySelector(".phase").textContent = PHASE_LABEL[phase] || phase;
  if (detail !== undefined) card.querySelector(".note").textContent = detail;
  if (!WAITING_PHASES.includes(phase)) {
    const actions = card.querySelector(".actions");
    if (actions) actions.remove();
  }
}

function approvalButtons(callId) {
  const card = view.calls.get(callId);
  if (!card || card.querySelector(".actions")) return;
  const actions = el("div", "actions");
  const decide = (approved) => async () => {
    for (const b of actions.querySelectorAll("button")) b.disabled = true;
    try {
      await api("POST", `/v1/sessions/${encodeURIComponent(view.sid)}/approvals/${encodeURIComponent(callId)}`,
        { approved, request_id: requestId() });
    } catch (e) {
      alert(e.message);
      for (const b of actions.querySelectorAll("button")) b.disabled = false;
    }
  };
  const approve = el("button", "approve", "Approve");
  approve.type = "button";
  approve.addEventListener("click", decide(true));
  const deny = el("button", "deny", "Deny");
  deny.type = "button";
  deny.addEventListener("click", decide(false));
  actions.append(approve, deny);
  card.append(actions);
}

// The answer to a call that raised NeedsHuman: run it again, record a result, or fail it.
// For a call whose outcome is unknown the same three answers say what happened: not
// applied (run it once more, same key), applied (with its result), or failed.
function resolutionButtons(callId, unknownOutcome) {
  const card = view.calls.get(callId);
  if (!card || card.querySelector(".actions")) return;
  const actions = el("div", "actions");
  const resolve = (action, ask) => async () => {
    const body = { action, request_id: requestId() };
    if (ask) {
      const given = prompt(ask, "");
      if (given === null) return; // the person changed their mind
      if (given.trim() !== "") {
        try { body.result = JSON.parse(given); } catch (e) { body.result = given; }
      }
    }
    for (const b of actions.querySelectorAll("button")) b.disabled = true;
    try {
      await api("POST", `/v1/sessions/${encodeURIComponent(view.sid)}/calls/${encodeURIComponent(callId)}/resolution`, body);
    } catch (e) {
      alert(e.message);
      for (const b of actions.querySelectorAll("button")) b.disabled = false;
    }
  };
  const buttons = unknownOutcome ? [
    ["skip", "Applied…", "It took effect. Its result, for the model (JSON or plain text):"],
    ["retry", "Not applied: run once more", null],
    ["fail", "Failed…", "What should the model be told? (optional)"],
  ] : [
    ["retry", "Retry", null],
    ["skip", "Skip…", "The result to record for this call (JSON or plain text):"],
    ["fail", "Fail…", "What should the model be told? (optional)"],
  ];
  for (const [action, label, ask] of buttons) {
    const button = el("button", "resolve-" + action, label);
    button.type = "button";
    button.addEventListener("click", resolve(action, ask));
    actions.append(button);
  }
  card.append(actions);
}

function onRecord(type, r, seq) {
  switch (type) {
    case "SessionCreated":
      note("event", `session created${r.system ? " (system prompt set)" : ""}`);
      break;
    case "InputAccepted":
      add(el("li", "user", r.text)).dataset.submission = r.submission_id;
      break;
    case "RunStarted":
      note("event", r.resumed_from
        ? `run ${r.run_id} continues ${r.resumed_from} (resume attempt ${r.resume_attempt})`
        : `run ${r.run_id} started`);
      break;
    case "GenerationStarted":
      assistant(r.generation_id).classList.add("streaming");
      break;
    case "RetryPending": {
      const wait = Math.max(0, r.not_before - r.at).toFixed(1);
      assistant(r.generation_id).querySelector(".retry").textContent =
        `model attempt ${r.attempt} failed (${r.error}); retrying in ${wait}s`;
      break;
    }
    case "GenerationCompleted": {
      const li = assistant(r.generation_id);
      li.classList.remove("streaming");
      const thought = (r.thinking || [])
        .map((b) => (b.type === "redacted_thinking" ? "(redacted reasoning)" : b.thinking))
        .join("\n\n");
      if (thought) {
        const reasoning = li.querySelector(".reasoning");
        reasoning.hidden = false;
        reasoning.querySelector(".thinking").textContent = thought;
      }
      const u = r.usage;
      li.querySelector(".usage").textContent =
        `${u.input_tokens} in / ${u.output_tokens} out tokens` + (r.model ? ` · ${r.model}` : "");
      li.querySelector(".text").textContent = r.text || (r.tool_calls.length ? "" : "(empty reply)");
      li.querySelector(".retry").textContent = "";
      const calls = li.querySelector(".calls");
      for (const call of r.tool_calls) calls.append(toolCard(call.call_id, call.name, call.input));
      break;
    }
    case "ToolTaskCreated": {
      const card = toolCard(r.call_id, r.tool_name, r.input);
      if (!card.isConnected) assistant(r.generation_id).querySelector(".calls").append(card);
      setPhase(r.call_id, "created");
      break;
    }
    case "ToolAwaitingApproval":
      setPhase(r.call_id, "awaiting_approval", r.reason);
      approvalButtons(r.call_id);
      break;
    case "ApprovalDecided":
      setPhase(r.call_id, r.approved ? "approved" : "denied",
        r.approved ? "approved by a human" : "denied by a human");
      break;
    case "ToolExecuting":
      if (view.calls.has(r.call_id)) view.calls.get(r.call_id).dataset.key = r.idempotency_key;
      setPhase(r.call_id, "executing",
        `policy ${r.replay}${r.attempt > 1 ? `, attempt ${r.attempt}` : ""}`);
      break;
    case "ToolHeartbeat":
      if (view.calls.has(r.call_id)) {
        view.calls.get(r.call_id).querySelector(".note").textContent =
          `heartbeat (attempt ${r.attempt}): ${JSON.stringify(r.details)}`;
      }
      break;
    case "AgentStarted":
      if (view.calls.has(r.call_id)) {
        view.calls.get(r.call_id).querySelector(".note").textContent =
          `started the sub-agent ${r.child}`;
      }
      break;
    case "ToolRetryPending": {
      const wait = Math.max(0, r.not_before - r.at).toFixed(1);
      setPhase(r.call_id, "retry_pending",
        `attempt ${r.attempt} failed (${r.error}); retrying in ${wait}s with the same key`);
      break;
    }
    case "ToolAwaitingHuman":
      setPhase(r.call_id, "awaiting_human", r.unknown_outcome
        ? `a person must say whether it took effect: ${r.reason}`
        : `needs a person: ${r.reason}`);
      resolutionButtons(r.call_id, r.unknown_outcome === true);
      break;
    case "ResolutionDecided":
      if (r.action === "retry") {
        setPhase(r.call_id, "retry_pending", "a person chose to run it again");
      } else if (view.calls.has(r.call_id)) { // its result follows in the same commit
        const card = view.calls.get(r.call_id);
        card.querySelector(".note").textContent = `a person chose to ${r.action} it`;
        const actions = card.querySelector(".actions");
        if (actions) actions.remove();
      }
      break;
    case "ToolCompleted": {
      const how = r.kind === "ok" ? "" : r.kind;
      setPhase(r.call_id, "completed", how + (r.duration ? ` ${r.duration.toFixed(2)}s` : ""));
      const card = view.calls.get(r.call_id);
      if (card) card.querySelector(".output").textContent = r.output;
      break;
    }
    case "ToolOutcomeUnknown": {
      setPhase(r.call_id, "outcome_unknown", r.reason);
      const card = view.calls.get(r.call_id);
      if (card) {
        card.querySelector(".output").textContent = r.output;
        unknownOutcome(card, r.call_id);
      }
      break;
    }
    case "CompensationRequested": {
      view.compensated.add(r.call_id);
      const card = view.calls.get(r.call_id);
      if (card) {
        card.querySelector(".note").textContent =
          `compensation ${r.compensation_id} requested${r.automatic ? " (automatic)" : ""}`;
        const undo = card.querySelector(".undo");
        if (undo) undo.remove();
      }
      note("event", `compensating ${r.call_id} with ${r.compensation_id}`);
      break;
    }
    case "CompensationFinished":
      note("event", `compensation ${r.compensation_id} finished`);
      break;
    case "ToolCancelled":
      setPhase(r.call_id, "cancelled", r.reason);
      break;
    case "RunFinished": {
      const text = r.status === "completed"
        ? `run ${r.run_id} completed`
        : r.status === "interrupted"
          ? `run ${r.run_id} interrupted (it continues as a new run)`
          : `run ${r.run_id} ${r.status}${r.reason ? ": " + r.reason : ""}`;
      note(`event run-finished ${r.status}`, text).dataset.run = r.run_id;
      if (r.status !== "interrupted") loadSessions();
      break;
    }
    case "CancelRequested":
      note("event", `cancel requested for run ${r.run_id}`);
      compensateButtons(r.compensable);
      break;
    case "GoalRevised":
      note("revision", `request ${r.steered ? "steered by new input" : "revised"} (revision ${r.goal_rev}): ${r.text}`);
      compensateButtons(r.compensable);
      break;
    case "WorkspaceCheckpointed": {
      const card = view.calls.get(r.call_id);
      if (card) workspaceActions(card, r);
      break;
    }
    case "WorkspaceRestoreStarted":
      note("event", `rewinding the workspace to record ${r.position}`);
      break;
    case "WorkspaceRestored":
      note(r.error ? "event run-finished failed" : "event",
        r.error ? `rewind refused, nothing restored: ${r.error}` : "workspace restored");
      break;
    case "SessionForked":
      note("event", `forked from ${r.source} at record ${r.position} (${r.records} records copied)`);
      break;
    case "SessionPaused":
      note("event", "session paused: nothing new is dispatched");
      break;
    case "SessionResumed":
      note("event", "session resumed");
      break;
    case "SessionParked":
      note("event run-finished failed", `session parked: ${r.reason}`);
      break;
    case "LogOpened":
      note("restart", `⟳ runtime restarted (epoch ${r.epoch}, pid ${r.pid}, ${new Date(r.at * 1000).toLocaleTimeString()})`);
      break;
    case "RecoveryDecision": {
      note("recovery", `recovery: ${r.subject}: found ${r.found} → ${r.action} (${r.reason})`);
      const card = view.calls.get(r.subject);
      if (card) card.querySelector(".note").textContent = `recovery: ${r.action}`;
      break;
    }
  }
}

// A call that may or may not have taken effect: say so loudly, and what can be done.
// No undo is offered: the runtime compensates only a completed call (the undo is
// handed the call's result), so a button here could only be refused.
function unknownOutcome(card, callId) {
  card.classList.add("unknown");
  if (card.querySelector(".next")) return;
  const name = card.querySelector(".head strong").textContent;
  const next = el("div", "next");
  next.append(el("strong", "", "Outcome unknown: it may or may not have happened."));
  const list = el("ul");
  const key = card.dataset.key ? ` (its idempotency key: ${card.dataset.key})` : "";
  list.append(el("li", "", `Look: check the system ${name} acts on for its effect${key}.`));
  list.append(el("li", "", "Tell the agent what you found, so it carries on from the truth."));
  next.append(list);
  const actions = el("div", "actions");
  const tell = el("button", "tell", "Tell the agent…");
  tell.type = "button";
  tell.addEventListener("click", () => {
    $("#text").value = `About ${name} [${callId}], whose outcome was unknown: I checked, and `;
    $("#text").focus();
  });
  actions.append(tell);
  next.append(actions);
  card.append(next);
}

// A workspace call's checkpoint: which files it changed, its diff on request, and a
// rewind of the files to just before it (refused by the runtime while a run is active).
function workspaceActions(card, r) {
  const old = card.querySelector(".workspace");
  if (old) old.remove();
  const box = el("div", "workspace");
  box.append(el("div", "files", r.changed.length
    ? `changed: ${r.changed.join(", ")}` : "changed no file"));
  const actions = el("div", "actions");
  const show = el("button", "diff", "Diff");
  show.type = "button";
  const patch = el("pre", "patch");
  patch.hidden = true;
  show.addEventListener("click", async () => {
    if (!patch.hidden) { patch.hidden = true; return; }
    try {
      const d = await api("GET", `/v1/sessions/${encodeURIComponent(view.sid)}/diff?call_id=${encodeURIComponent(r.call_id)}`);
      patch.textContent = d.calls.map((c) => c.patch || "(no change)").join("\n");
      patch.hidden = false;
    } catch (e) {
      alert(e.message);
    }
  });
  const rewind = el("button", "rewind", "Rewind files to before this call");
  rewind.type = "button";
  rewind.title = "Put the workspace's files back as they were before this call (the conversation stays)";
  rewind.addEventListener("click", async () => {
    if (!confirm("Put every tracked file of the workspace back as it was before this call?")) return;
    rewind.disabled = true;
    try {
      await api("POST", `/v1/sessions/${encodeURIComponent(view.sid)}/rewind`,
        { request_id: requestId(), to: r.call_id });
    } catch (e) {
      alert(e.message);
    }
    rewind.disabled = false;
  });
  actions.append(show, rewind);
  box.append(actions, patch);
  card.append(box);
}

// The undo of completed calls, offered only where it exists: a cancel or a revision
// lists the completed calls whose tool declares a compensation (the runtime decides
// the list from the registered tools), and a requested compensation takes it away.
function compensateButtons(callIds) {
  for (const callId of callIds || []) {
    const card = view.calls.get(callId);
    if (!card || view.compensated.has(callId) || card.querySelector(".undo")) continue;
    const undo = el("div", "actions undo");
    const compensate = el("button", "compensate", "Compensate");
    compensate.type = "button";
    compensate.title = "Run this tool's compensation (its undo) as a durable call of its own";
    compensate.addEventListener("click", async () => {
      compensate.disabled = true;
      try {
        await api("POST", `/v1/sessions/${encodeURIComponent(view.sid)}/compensations/${encodeURIComponent(callId)}`,
          { request_id: requestId() });
      } catch (e) {
        alert(e.message);
        compensate.disabled = false;
      }
    });
    undo.append(compensate);
    card.append(undo);
  }
}

function onEphemeral(type, data) {
  if (type === "model_call") {
    const li = assistant(data.generation_id);
    li.classList.add("streaming");
    li.querySelector(".text").textContent = ""; // a new attempt starts from scratch
    li.querySelector(".reasoning .thinking").textContent = "";
  } else if (type === "thinking_delta") {
    const li = assistant(data.generation_id);
    if (!li.classList.contains("streaming")) return;
    const reasoning = li.querySelector(".reasoning");
    reasoning.hidden = false;
    reasoning.open = true;
    reasoning.querySelector(".thinking").textContent += data.thinking;
  } else if (type === "text_delta") {
    const li = assistant(data.generation_id);
    if (!li.classList.contains("streaming")) return; // the committed reply is already shown
    li.querySelector(".text").textContent += data.text;
    li.dataset.deltas = String(Number(li.dataset.deltas || 0) + 1);
    const detail = $("#detail");
    detail.scrollTop = detail.scrollHeight;
  } else if (type === "tool_progress") {
    const card = view.calls.get(data.call_id);
    if (card) card.querySelector(".note").textContent = data.message;
  } else if (type === "session_deleted") {
    note("event run-finished failed", `session deleted (${data.records} records)`);
    if (view.source) view.source.close(); // nothing more will come
    loadSessions();
  }
}

// -- the summary (GET /v1/sessions/{id}) ----------------------------------------------

function scheduleSummary() {
  clearTimeout(view.summaryTimer);
  view.summaryTimer = setTimeout(refreshSummary, 250);
}

async function refreshSummary() {
  const sid = view.sid;
  if (!sid) return;
  let s;
  try {
    s = await api("GET", `/v1/sessions/${encodeURIComponent(sid)}`);
  } catch (e) {
    return;
  }
  if (sid !== view.sid) return;
  const badge = $("#status");
  badge.textContent = s.status.replace("_", " ");
  badge.dataset.status = s.status;
  const box = $("#summary");
  box.replaceChildren();
  if (s.request.text !== null) {
    box.append(el("div", "", `request in force (revision ${s.request.goal_rev}): ${s.request.text}`));
  }
  box.append(el("div", "", "next: " + s.next.join("; ")));
  const unpriced = s.cost.unpriced_models.length
    ? ` (no price for ${s.cost.unpriced_models.join(", ")})` : "";
  const spend = el("div", "spend",
    `tokens: ${s.usage.input_tokens} in, ${s.usage.output_tokens} out; ` +
    `cost: $${s.cost.usd.toFixed(4)}${unpriced}`);
  if (s.budget) spend.textContent += "; budget: " + describeBudget(s.budget);
  box.append(spend);
  const context = s.context;
  if (context && (context.compactions.length || context.compacting)) {
    // What the model is sent: a summary in place of the older items (the log keeps all).
    const line = el("div", "context");
    const done = context.compactions;
    let text = "";
    if (done.length) {
      const last = done[done.length - 1];
      text = `context: ${done.length} compaction(s); the model is sent a summary of the ` +
        `first ${context.summarised} of ${context.items} items ` +
        `(last: ${last.tokens_before} -> ~${last.tokens_after} tokens)`;
    }
    if (context.compacting) {
      text += (text ? "; " : "") + `compacting items ${context.compacting.items.join("-")}`;
    }
    if (context.abandoned) text += `; last compaction made nothing: ${context.abandoned}`;
    line.textContent = text;
    box.append(line);
  }
  for (const u of s.unconfirmed) {
    box.append(el("div", "unconfirmed", `unconfirmed: ${u.tool} [${u.call_id}]: ${u.why}`));
  }
  if (s.runs.length) {
    const table = el("table", "runs");
    const head = el("tr");
    for (const h of ["run", "status", "tokens in", "tokens out", "cost"]) head.append(el("th", "", h));
    table.append(head);
    for (const run of s.runs) {
      const row = el("tr");
      row.dataset.run = run.run_id;
      row.append(el("td", "", run.run_id), el("td", "", run.status),
        el("td", "", String(run.usage.input_tokens)), el("td", "", String(run.usage.output_tokens)),
        el("td", "", `$${run.cost.usd.toFixed(4)}`));
      table.append(row);
    }
    box.append(table);
  }
}

// The limits a session's budget sets, as "name value" pairs (unset limits are omitted).
function describeBudget(b) {
  return Object.entries(b).filter(([, v]) => v !== null).map(([k, v]) => `${k} ${v}`).join(", ")
    || "none";
}

// -- forms -------------------------------------------------------------------------------

$("#new-session").addEventListener("submit", async (ev) => {
  ev.preventDefault();
  const text = $("#new-text").value.trim();
  if (!text) return;
  try {
    const created = await api("POST", "/v1/sessions", {});
    await loadSessions();
    // Listen before asking, so the reply is seen streaming from its first delta.
    openSession(created.session_id);
    await streamOpen(2000);
    await api("POST", `/v1/sessions/${encodeURIComponent(created.session_id)}/messages`,
      { text, request_id: requestId() });
    $("#new-text").value = "";
  } catch (e) {
    alert(e.message);
  }
});

$("#send").addEventListener("submit", async (ev) => {
  ev.preventDefault();
  const text = $("#text").value.trim();
  if (!text || !view.sid) return;
  const base = `/v1/sessions/${encodeURIComponent(view.sid)}`;
  try {
    if ($("#as-revision").checked) {
      await api("POST", base + "/revisions", { text, request_id: requestId() });
    } else {
      await api("POST", base + "/messages", { text, request_id: requestId() });
    }
    $("#text").value = "";
  } catch (e) {
    alert(e.message);
  }
});

for (const action of ["pause", "resume", "cancel"]) {
  $("#" + action).addEventListener("click", async () => {
    if (!view.sid) return;
    try {
      await api("POST", `/v1/sessions/${encodeURIComponent(view.sid)}/${action}`, { request_id: requestId() });
      scheduleSummary();
    } catch (e) {
      alert(e.message);
    }
  });
}

async function start() {
  try {
    Object.assign(who, await api("GET", "/v1/whoami"));
  } catch (e) {
    // keep the admin default: the routes themselves will say what is refused
  }
  document.body.dataset.scope = who.scope;
  if (who.scope !== "admin") {
    const until = new Date(who.expires_at * 1000).toLocaleString();
    $("#scope").textContent =
      `${who.scope === "read" ? "read-only" : "read & write"} access to ${who.session_id}, until ${until}`;
    $("#scope").hidden = false;
    setConn("live", "connected");
    openSession(who.session_id);
  } else {
    loadSessions();
    setInterval(loadSessions, 3000);
    if (location.hash.length > 1) openSession(decodeURIComponent(location.hash.slice(1)));
  }
  setInterval(() => { if (view.sid) refreshSummary(); }, 5000);
}

start();
