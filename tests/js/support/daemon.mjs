// A real `perdure serve` for the Node tests: started as a user would start it
// (scripted model, the ledger tools of tests/support), stopped by real signals.
// tests/server/test_js_clients.py runs these tests and tells them, through the
// environment, which Python runs perdure (PERDURE_PYTHON) and where the repository
// is (PERDURE_ROOT).
import { spawn } from "node:child_process";
import { mkdtempSync, readFileSync, writeFileSync, mkdirSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { once } from "node:events";
import { createInterface } from "node:readline";

export class Daemon {
  constructor(script) {
    this.root = mkdtempSync(join(process.env.PERDURE_TMP || tmpdir(), "perdure-js-"));
    this.log = join(this.root, "log");
    this.workspace = join(this.root, "ws");
    mkdirSync(this.workspace, { recursive: true });
    this.scriptPath = join(this.root, "script.json");
    writeFileSync(this.scriptPath, JSON.stringify({ replies: script }));
    this.port = 0;
    this.proc = null;
    this.url = "";
  }

  async start() {
    const python = process.env.PERDURE_PYTHON || "python3";
    const root = process.env.PERDURE_ROOT || process.cwd();
    /** @type {Record<string, string | undefined>} */
    const env = { ...process.env, PYTHONPATH: root };
    delete env.PERDURE_TOKEN;
    delete env.PERDURE_FAULT;
    const args = [
      "-m", "perdure.cli", "serve",
      "--log", this.log, "--port", String(this.port),
      "--provider", `scripted:${this.scriptPath}`,
      "--tools", "tests.support.ledger_tools:ALL_TOOLS",
      "--workspace", this.workspace, "--heartbeat", "1",
    ];
    const proc = spawn(python, args, { cwd: root, env, stdio: ["ignore", "pipe", "inherit"] });
    this.proc = proc;
    const lines = createInterface({ input: proc.stdout });
    const exited = once(proc, "exit").then(([code]) => {
      throw new Error(`perdure serve exited (${code}) before listening`);
    });
    const listening = (async () => {
      for await (const line of lines) {
        const found = /listening on (http:\/\/\S+)/.exec(line);
        if (found) return found[1];
      }
      throw new Error("perdure serve closed its output before listening");
    })();
    this.url = await Promise.race([listening, exited]);
    exited.catch(() => {}); // it exits later, when we stop it
    this.port = Number(this.url.split(":").pop());
    this.token = readFileSync(join(this.log, "daemon.token"), "utf8").trim();
    return this;
  }

  // SIGKILL: a crash, as far as the log can tell.
  async kill() {
    if (this.proc && this.proc.exitCode === null && this.proc.signalCode === null) {
      const gone = once(this.proc, "exit");
      this.proc.kill("SIGKILL");
      await gone;
    }
  }

  async stop() {
    if (this.proc && this.proc.exitCode === null && this.proc.signalCode === null) {
      const gone = once(this.proc, "exit");
      this.proc.kill("SIGTERM");
      await gone;
    }
  }

  // `perdure check --settled` on the log (after stop()): checksums and invariants.
  async check() {
    const python = process.env.PERDURE_PYTHON || "python3";
    const root = process.env.PERDURE_ROOT || process.cwd();
    const proc = spawn(python, ["-m", "perdure.cli", "check", "--settled", "--log", this.log], {
      cwd: root, env: { ...process.env, PYTHONPATH: root }, stdio: ["ignore", "pipe", "pipe"],
    });
    let output = "";
    proc.stdout.on("data", (d) => { output += d; });
    proc.stderr.on("data", (d) => { output += d; });
    const [code] = await once(proc, "exit");
    return { code, output };
  }

  headers() {
    return { Authorization: `Bearer ${this.token}` };
  }

  async get(path) {
    const resp = await fetch(this.url + path, { headers: this.headers() });
    if (!resp.ok) throw new Error(`GET ${path}: ${resp.status} ${await resp.text()}`);
    return resp.json();
  }

  async post(path, body) {
    const resp = await fetch(this.url + path, {
      method: "POST",
      headers: { ...this.headers(), "content-type": "application/json" },
      body: JSON.stringify(body),
    });
    if (!resp.ok) throw new Error(`POST ${path}: ${resp.status} ${await resp.text()}`);
    return resp.json();
  }
}

// Resolves when check() is true, re-checking whenever poke() is called.
export function waiter() {
  let listeners = [];
  return {
    poke() {
      const now = listeners;
      listeners = [];
      for (const fn of now) fn();
    },
    async until(check, what, ms = 30000) {
      const deadline = Date.now() + ms;
      while (!check()) {
        if (Date.now() > deadline) throw new Error(`timed out waiting for ${what}`);
        await new Promise((resolve) => {
          listeners.push(resolve);
          setTimeout(resolve, 200);
        });
      }
    },
  };
}

// The session's transcript, flattened to what a chat UI shows: assistant text,
// tool calls with their input, and tool results, in order.
export async function transcriptItems(daemon, sid) {
  const { messages } = await daemon.get(`/v1/sessions/${sid}/transcript`);
  const items = [];
  for (const m of messages) {
    for (const b of m.content) {
      if (m.role === "assistant" && b.type === "text" && b.text) items.push({ text: b.text });
      if (b.type === "tool_use") items.push({ call: b.id, name: b.name, input: b.input });
      if (b.type === "tool_result") items.push({ result: b.tool_use_id, output: b.content });
    }
  }
  return items;
}
