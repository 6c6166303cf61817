// redlm chat page: keeps the conversation, POSTs it to /api/chat and reads
// the answer as server-sent events from the response body (fetch + a stream
// reader, since EventSource cannot POST). Each event is applied to the page
// as soon as it arrives: reasoning_content goes to the collapsible
// "Reasoning" block, content to the answer. Stop aborts the fetch; the
// backend sees the closed connection and cancels the job.
"use strict";

const $ = (id) => document.getElementById(id);
const log = $("log"), input = $("input"), send = $("send"), think = $("think");
const STORE = "redlm-chat";
let history = [];     // [{role, content}] as sent to the model; answers only, no reasoning
let running = null;   // AbortController of the request in flight

function el(tag, cls, text) {
  const e = document.createElement(tag);
  if (cls) e.className = cls;
  if (text !== undefined) e.textContent = text;
  return e;
}

function scrollDown() { log.scrollTop = log.scrollHeight; }

function addUser(text) {
  $("empty")?.remove();
  const m = el("div", "msg user");
  m.append(el("div", "role", "you"), el("div", "text", text));
  log.append(m);
  scrollDown();
}

// An assistant bubble; returns handles to its parts.
function addAssistant() {
  $("empty")?.remove();
  const m = el("div", "msg assistant");
  m.dataset.state = "streaming";
  m.classList.add("streaming");
  const reasoning = el("details", "reasoning");
  reasoning.open = true;
  reasoning.hidden = true;  // shown on the first reasoning token
  const summary = el("summary", "", "Reasoning");
  const rtext = el("div", "reasoning-text");
  reasoning.append(summary, rtext);
  const answer = el("div", "answer");
  const meta = el("div", "meta");
  m.append(el("div", "role", "redlm"), reasoning, answer, meta);
  log.append(m);
  scrollDown();
  return { m, reasoning, summary, rtext, answer, meta };
}

function showError(parent, code, message) {
  const e = el("div", "error");
  e.setAttribute("role", "alert");
  e.append(el("code", "", code), document.createTextNode(" " + message));
  parent.append(e);
  scrollDown();
}

function save() {
  try { localStorage.setItem(STORE, JSON.stringify({ history, think: think.checked })); } catch (_) {}
}

function restore() {
  let s;
  try { s = JSON.parse(localStorage.getItem(STORE) || "null"); } catch (_) { s = null; }
  if (!s || !Array.isArray(s.history)) return;
  think.checked = !!s.think;
  history = s.history;
  for (const t of history) {
    if (t.role === "user") addUser(t.content);
    else {
      const a = addAssistant();
      a.answer.textContent = t.content;
      a.m.dataset.state = "done";
      a.m.classList.remove("streaming");
    }
  }
}

// Splits the text/event-stream body into events: {event, data, id}.
async function* sse(body) {
  const reader = body.pipeThrough(new TextDecoderStream()).getReader();
  let buf = "";
  for (;;) {
    const { value, done } = await reader.read();
    if (done) return;
    buf += value;
    let i;
    while ((i = buf.indexOf("\n\n")) >= 0) {
      const block = buf.slice(0, i);
      buf = buf.slice(i + 2);
      const ev = { event: "message", data: "", id: null };
      for (const line of block.split("\n")) {
        if (line.startsWith(":")) continue;  // keep-alive comment
        const c = line.indexOf(":");
        const k = c < 0 ? line : line.slice(0, c);
        const v = c < 0 ? "" : line.slice(c + 1).replace(/^ /, "");
        if (k === "event") ev.event = v;
        else if (k === "data") ev.data += (ev.data ? "\n" : "") + v;
        else if (k === "id") ev.id = v;
      }
      if (ev.data) yield ev;
    }
  }
}

function setRunning(ctrl) {
  running = ctrl;
  send.textContent = ctrl ? "Stop" : "Send";
  send.classList.toggle("stop", !!ctrl);
  send.type = ctrl ? "button" : "submit";
}

async function ask(text) {
  history.push({ role: "user", content: text });
  addUser(text);
  const a = addAssistant();
  const ctrl = new AbortController();
  setRunning(ctrl);
  let answer = "", reasoning = "", finished = false;
  const fail = (code, message) => {
    a.m.dataset.state = "error";
    showError(a.m, code, message);
  };
  try {
    const res = await fetch("/api/chat", {
      method: "POST",
      headers: { "Content-Type": "application/json" },
      body: JSON.stringify({ messages: history, think: think.checked }),
      signal: ctrl.signal,
    });
    if (!res.ok) {
      let e;
      try { e = await res.json(); } catch (_) { e = { code: "HTTP_" + res.status, message: res.statusText }; }
      fail(e.code || "HTTP_" + res.status, e.message || "request failed");
    } else {
      for await (const ev of sse(res.body)) {
        const d = JSON.parse(ev.data);
        if (ev.event === "job") {
          a.m.dataset.jobId = d.id;
        } else if (ev.event === "delta") {
          const r = d.delta.reasoning_content, c = d.delta.content;
          if (r) {
            reasoning += r;
            a.reasoning.hidden = false;
            a.rtext.textContent = reasoning;
          }
          if (c) {
            answer += c;
            a.answer.textContent = answer;
          }
          scrollDown();
        } else if (ev.event === "error") {
          fail(d.code || "ERROR", d.message || "the request failed");
        } else if (ev.event === "done") {
          finished = true;
          const u = d.usage || {};
          const t = d.timings || {};
          let meta = `${d.finish_reason} · ${u.completion_tokens ?? "?"} tokens`;
          if (u.reasoning_tokens) meta += ` (${u.reasoning_tokens} reasoning)`;
          if (d.cached) meta += " · cached";
          if (t.total_ms !== undefined) meta += ` · first token ${t.ttft_ms} ms, total ${t.total_ms} ms`;
          a.meta.textContent = meta;
          if (reasoning) a.summary.textContent = `Reasoning (${reasoning.length} characters)`;
          if (a.m.dataset.state !== "error") a.m.dataset.state = "done";
        }
      }
      if (!finished && a.m.dataset.state !== "error")
        fail("DISCONNECTED", "the stream ended before the answer was complete");
    }
  } catch (e) {
    if (e.name === "AbortError") {
      a.m.dataset.state = "cancelled";
      a.meta.textContent = "stopped";
    } else {
      fail("NETWORK", "cannot reach the web backend: " + e.message);
    }
  }
  a.m.classList.remove("streaming");
  if (a.m.dataset.state === "done" || (a.m.dataset.state === "cancelled" && answer)) {
    history.push({ role: "assistant", content: answer });
  } else {
    history.pop();  // a failed turn is not part of the conversation
  }
  save();
  setRunning(null);
  input.focus();
}

$("composer").addEventListener("submit", (e) => {
  e.preventDefault();
  const text = input.value.trim();
  if (!text || running) return;
  input.value = "";
  ask(text);
});
send.addEventListener("click", () => { if (running) running.abort(); });
input.addEventListener("keydown", (e) => {
  if (e.key === "Enter" && !e.shiftKey) {
    e.preventDefault();
    $("composer").requestSubmit();
  }
});
think.addEventListener("change", save);
$("new-chat").addEventListener("click", () => {
  if (running) running.abort();
  history = [];
  save();
  log.replaceChildren(el("p", "empty", "New conversation."));
  log.firstChild.id = "empty";
  input.focus();
});
restore();
input.focus();
