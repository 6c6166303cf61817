// redlm chat page: keeps the conversations, POSTs the current one to
// /api/chat and reads the answer as server-sent events from the response
// body (fetch + a stream reader, since EventSource cannot POST). Each event
// is applied to the page as soon as it arrives: reasoning_content goes to
// the collapsible "Reasoning" block, content to the answer, rendered as
// Markdown (markdown.js; HTML in the text is escaped). Stop aborts the
// fetch; the backend sees the closed connection and cancels the job.
//
// Storage: localStorage[STORE] = {current, chats: [{id, title, think,
// updated, turns}]}; a turn is {role, content} plus, for an answer, the
// reasoning, the meta line and the state it ended in (done / cancelled).
// Only role and content are sent to the model. A failed turn (error, no
// answer) is shown but not kept: it is not part of the conversation.
//
// The send button is type="button" at all times: the form is submitted
// only by our own handlers (Send while idle, Enter), so a click on Stop can
// never also send the draft, and the browser never validates the textarea.
"use strict";

const $ = (id) => document.getElementById(id);
const log = $("log"), input = $("input"), send = $("send"), think = $("think"), hint = $("hint");
const chatList = $("chats");
const STORE = "redlm-chats", OLD_STORE = "redlm-chat";
let store = { current: null, chats: [] };
let running = null;   // {ctrl, chat} of the request in flight

function el(tag, cls, text) {
  const e = document.createElement(tag);
  if (cls) e.className = cls;
  if (text !== undefined) e.textContent = text;
  return e;
}

function scrollDown() { log.scrollTop = log.scrollHeight; }

function chat() { return store.chats.find((c) => c.id === store.current); }

function newId() { return Date.now().toString(36) + Math.random().toString(36).slice(2, 8); }

function setHint(text) {
  hint.textContent = text || "";
  hint.hidden = !text;
}

// ---- rendering of turns ----

function addUser(text) {
  $("empty")?.remove();
  const m = el("div", "msg user");
  m.append(el("div", "role", "you"), el("div", "text", text));
  log.append(m);
  scrollDown();
}

// Sets an answer's Markdown source and its rendering. One wrapper element
// per update, so the page (and a test observing it) sees whole values.
function setAnswer(answer, md) {
  answer.dataset.md = md;
  const w = el("div", "md");
  w.dataset.md = md;
  w.innerHTML = Markdown.render(md);
  answer.replaceChildren(w);
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
  const actions = el("div", "actions");
  m.append(el("div", "role", "redlm"), reasoning, answer, meta, actions);
  log.append(m);
  scrollDown();
  return { m, reasoning, summary, rtext, answer, meta, actions };
}

function showError(parent, code, message) {
  const e = el("div", "error");
  e.setAttribute("role", "alert");
  e.append(el("code", "", code), document.createTextNode(" " + message));
  parent.insertBefore(e, parent.querySelector(".actions"));
  scrollDown();
}

// Only the last answer of a conversation can be regenerated, and only
// while nothing runs.
function updateRegenerate() {
  for (const b of log.querySelectorAll(".regenerate")) b.remove();
  const last = log.lastElementChild;
  if (running || !last || !last.classList.contains("assistant")) return;
  const c = chat();
  if (!c || !c.turns.length || c.turns[c.turns.length - 1].role !== "assistant") return;
  const b = el("button", "regenerate", "Regenerate");
  b.type = "button";
  b.title = "Ask for this answer again";
  b.addEventListener("click", regenerate);
  last.querySelector(".actions").append(b);
}

function renderChat() {
  log.replaceChildren();
  const c = chat();
  if (!c || !c.turns.length) {
    const p = el("p", "empty", c && c.turns.length === 0 && store.chats.length > 1 ? "New conversation." :
      "Ask something. Answers stream in token by token; with Thinking on, the model's reasoning is shown apart, above the answer.");
    p.id = "empty";
    log.append(p);
  }
  if (c) {
    think.checked = !!c.think;
    for (const t of c.turns) {
      if (t.role === "user") { addUser(t.content); continue; }
      const a = addAssistant();
      setAnswer(a.answer, t.content);
      if (t.reasoning) {
        a.reasoning.hidden = false;
        a.rtext.textContent = t.reasoning;
        a.summary.textContent = `Reasoning (${t.reasoning.length} characters)`;
        a.reasoning.open = false;
      }
      a.meta.textContent = t.meta || "";
      a.m.dataset.state = t.state || "done";
      a.m.classList.remove("streaming");
    }
  }
  updateRegenerate();
  renderList();
  scrollDown();
}

function renderList() {
  const items = [...store.chats].sort((a, b) => b.updated - a.updated).map((c) => {
    const li = el("li", c.id === store.current ? "chat current" : "chat");
    li.dataset.id = c.id;
    const open = el("button", "open", c.title || "New chat");
    open.type = "button";
    open.title = c.title || "New chat";
    open.addEventListener("click", () => { showChats(false); switchTo(c.id); });
    const del = el("button", "delete", "×");
    del.type = "button";
    del.title = "Delete this conversation";
    del.setAttribute("aria-label", "Delete " + (c.title || "this conversation"));
    del.addEventListener("click", () => removeChat(c.id));
    li.append(open, del);
    return li;
  });
  chatList.replaceChildren(...items);
}

// ---- storage ----

function save() {
  try { localStorage.setItem(STORE, JSON.stringify(store)); } catch (_) {}
}

function restore() {
  let s = null;
  try { s = JSON.parse(localStorage.getItem(STORE) || "null"); } catch (_) { s = null; }
  if (s && Array.isArray(s.chats)) {
    store = { current: s.current, chats: s.chats.filter((c) => c && Array.isArray(c.turns)) };
  } else {
    // the page's first format: one conversation under "redlm-chat"
    let old = null;
    try { old = JSON.parse(localStorage.getItem(OLD_STORE) || "null"); } catch (_) { old = null; }
    if (old && Array.isArray(old.history) && old.history.length) {
      store.chats.push({ id: newId(), title: titleOf(old.history), think: !!old.think,
                         updated: Date.now(), turns: old.history });
      store.current = store.chats[0].id;
    }
  }
  if (!chat()) {
    if (!store.chats.length) store.chats.push(emptyChat());
    store.current = [...store.chats].sort((a, b) => b.updated - a.updated)[0].id;
  }
}

function emptyChat() { return { id: newId(), title: "", think: think.checked, updated: Date.now(), turns: [] }; }

function titleOf(turns) {
  const u = turns.find((t) => t.role === "user");
  if (!u) return "";
  const t = u.content.replace(/\s+/g, " ").trim();
  return t.length > 48 ? t.slice(0, 47) + "…" : t;
}

function switchTo(id) {
  if (running) running.ctrl.abort();
  store.current = id;
  save();
  renderChat();
  setHint("");
  input.focus();
}

function removeChat(id) {
  if (running && running.chat.id === id) running.ctrl.abort();
  store.chats = store.chats.filter((c) => c.id !== id);
  if (!store.chats.length) store.chats.push(emptyChat());
  if (!chat()) store.current = [...store.chats].sort((a, b) => b.updated - a.updated)[0].id;
  save();
  renderChat();
}

// ---- the request ----

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

function setRunning(r) {
  running = r;
  send.textContent = r ? "Stop" : "Send";
  send.classList.toggle("stop", !!r);
  send.title = r ? "Stop the answer (Esc)" : "Send (Enter)";
  if (!r) setHint("");
  updateRegenerate();
}

// Sends the conversation c (its last turn is the user's) and appends the
// answer to it.
async function run(c) {
  const a = addAssistant();
  const ctrl = new AbortController();
  setRunning({ ctrl, chat: c });
  let answer = "", reasoning = "", finished = false;
  const fail = (code, message) => {
    a.m.dataset.state = "error";
    showError(a.m, code, message);
  };
  try {
    const res = await fetch("/api/chat", {
      method: "POST",
      headers: { "Content-Type": "application/json" },
      body: JSON.stringify({ messages: c.turns.map((t) => ({ role: t.role, content: t.content })),
                             think: think.checked }),
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
          const r = d.delta.reasoning_content, t = d.delta.content;
          if (r) {
            reasoning += r;
            a.reasoning.hidden = false;
            a.rtext.textContent = reasoning;
          }
          if (t) {
            answer += t;
            setAnswer(a.answer, answer);
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
  const state = a.m.dataset.state;
  if (state === "done" || (state === "cancelled" && answer)) {
    c.turns.push({ role: "assistant", content: answer, reasoning, meta: a.meta.textContent, state });
  } else {
    c.turns.pop();  // a failed turn is not part of the conversation
  }
  c.updated = Date.now();
  save();
  setRunning(null);
  if (c === chat()) renderList();
  input.focus();
}

function ask(text) {
  const c = chat();
  c.turns.push({ role: "user", content: text });
  c.think = think.checked;
  if (!c.title) c.title = titleOf(c.turns);
  c.updated = Date.now();
  save();
  renderList();
  addUser(text);
  return run(c);
}

// Drops the last answer and asks again with the same conversation.
function regenerate() {
  const c = chat();
  if (running || !c || c.turns[c.turns.length - 1]?.role !== "assistant") return;
  c.turns.pop();
  log.lastElementChild.remove();
  save();
  run(c);
}

function submit() {
  const text = input.value.trim();
  if (running) {
    setHint("An answer is still streaming: Stop it (Esc) or wait. Your draft is kept.");
    return;
  }
  if (!text) {
    setHint("Type a message first.");
    input.focus();
    return;
  }
  setHint("");
  input.value = "";
  ask(text);
}

$("composer").addEventListener("submit", (e) => { e.preventDefault(); submit(); });
send.addEventListener("click", () => {
  if (running) running.ctrl.abort();
  else submit();
});
input.addEventListener("keydown", (e) => {
  if (e.key === "Enter" && !e.shiftKey && !e.isComposing) {
    e.preventDefault();
    submit();
  } else if (e.key === "Escape" && running) {
    e.preventDefault();
    running.ctrl.abort();
  }
});
input.addEventListener("input", () => { if (!running) setHint(""); });
think.addEventListener("change", () => { const c = chat(); if (c) { c.think = think.checked; save(); } });
// narrow screens: the conversation list as an overlay (style.css)
function showChats(on) {
  document.body.classList.toggle("chats-open", on);
  $("show-chats").setAttribute("aria-expanded", String(on));
}
$("show-chats").addEventListener("click", () => showChats(!document.body.classList.contains("chats-open")));
$("new-chat").addEventListener("click", () => {
  showChats(false);
  if (running) running.ctrl.abort();
  const c = chat();
  if (!(c && !c.turns.length)) {
    store.chats.push(emptyChat());
    store.current = store.chats[store.chats.length - 1].id;
  }
  save();
  renderChat();
  input.focus();
});
// code blocks' copy buttons, for every answer now and later
log.addEventListener("click", async (e) => {
  const b = e.target.closest(".copy");
  if (!b) return;
  const code = b.closest(".code-block").querySelector("code").textContent;
  let ok = false;
  try { await navigator.clipboard.writeText(code); ok = true; } catch (_) {
    // no clipboard permission (plain http on another host): the old way
    const t = el("textarea");
    t.value = code;
    document.body.append(t);
    t.select();
    try { ok = document.execCommand("copy"); } catch (_) { ok = false; }
    t.remove();
  }
  b.textContent = ok ? "Copied" : "Copy failed";
  setTimeout(() => { b.textContent = "Copy"; }, 1500);
});
restore();
renderChat();
input.focus();
