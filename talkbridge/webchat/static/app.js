// The talkbridge webchat page. Plain ES module, no build step, no network beyond its own origin.
//
// Protocol: docs/webchat-protocol.md. The essentials, as this page uses them:
// - auth first (token from ?token= or localStorage, plus our session id if we have one);
// - every message carries a per-thread `seq`; we keep messages in a Map by seq, so whatever
//   arrives twice (history after a reconnect, a broadcast racing it) is shown once;
// - what we send waits in an outbox (kept in localStorage) under a client id until the server
//   acknowledges it; after a reconnect or a reload the outbox is sent again with the same ids,
//   and the server never makes a second turn of a client id it has seen;
// - tabs share the outbox, but each message is sent by the tab it was typed in while that tab
//   lives; another tab takes it over once that tab is gone (its Web Lock is released);
// - what can no longer be sent as it was (refused, or its session or conversation is gone) is
//   never dropped: it stays on screen as "Not sent" (kept in localStorage too), to send again
//   in the conversation shown, copy, or dismiss;
// - what is typed in the message box and not sent yet is a draft, kept per conversation in
//   localStorage (never sent anywhere): a reload, a crashed tab or a switch to another
//   conversation and back finds it in the box again. It leaves storage the moment it goes into
//   the outbox, which holds it from then on: a reload never shows it twice, nor sends it twice.

import { renderMarkdown, renderPlain, settledLength } from "./markdown.js";
import { insertSeqs, lowerBound, placeChildren } from "./order.js";

const KEY = {
  token: "talkbridge.token",
  session: "talkbridge.session",
  active: "talkbridge.active",
  outbox: "talkbridge.outbox",
  unsent: "talkbridge.unsent",
  draft: "talkbridge.draft.", // + the thread id (which starts with the session id)
};
const TYPING_MS = 8000;
const ANNOUNCE_MAX = 200; // characters of a reply a screen reader reads out unasked
const PING_EVERY_MS = 20000;
const PONG_WITHIN_MS = 10000; // no answer by then: the connection is dead, though not closed
const BACKOFF_BASE_MS = 500;
const BACKOFF_CAP_MS = 30000;
const DRAFT_KEPT_MS = 30 * 24 * 3600 * 1000; // a draft of another session: then it goes

const $ = (id) => document.getElementById(id);
const ui = {
  app: $("app"),
  main: document.querySelector("main"),
  sidebar: $("sidebar"),
  scrim: $("scrim"),
  openSidebar: $("open-sidebar"),
  closeSidebar: $("close-sidebar"),
  newConversation: $("new-conversation"),
  list: $("conversation-list"),
  title: $("chat-title"),
  status: $("status"),
  statusText: $("status-text"),
  retry: $("retry"),
  messages: $("messages"), // scrolls
  log: $("log"), // holds the messages
  empty: $("empty"),
  typing: $("typing"),
  toast: $("toast"),
  announcer: $("announcer"),
  composer: $("composer"),
  input: $("input"),
  tooLong: $("too-long"),
  hint: $("hint"),
  fatal: $("fatal"),
  fatalTitle: $("fatal-title"),
  fatalText: $("fatal-text"),
  newer: $("newer"),
  earlier: Object.assign(document.createElement("button"), {
    type: "button",
    className: "earlier",
  }),
};

function storageGet(key) {
  try {
    return localStorage.getItem(key);
  } catch {
    return null;
  }
}
function storageSet(key, value) {
  try {
    if (value === null || value === undefined) localStorage.removeItem(key);
    else localStorage.setItem(key, value);
  } catch {
    /* private mode: the page still works, it just forgets on reload */
  }
}

const urlToken = new URLSearchParams(location.search).get("token");
if (urlToken) {
  storageSet(KEY.token, urlToken);
  // Out of the address bar (screenshots, shared screens, copied links): the server set a cookie
  // with it, so a reload or a bookmark of the plain address still opens this page.
  const plain = new URL(location.href);
  plain.searchParams.delete("token");
  history.replaceState(null, "", plain.pathname + plain.search + plain.hash);
}

const state = {
  token: urlToken || storageGet(KEY.token),
  sessionId: storageGet(KEY.session),
  active: storageGet(KEY.active),
  conversations: [],
  threads: new Map(),
  outbox: loadOutbox(),
  failed: loadUnsent(),
  ws: null,
  ready: false,
  attempt: 0,
  reconnectTimer: null,
  reconnectAt: 0, // when reconnectTimer fires (Date.now() time)
  countdownTimer: null,
  heartbeat: null,
  pongTimer: null,
  pendingConversation: null,
  limits: { max_frame_bytes: 65536 },
  refusal: null, // why the server refused our token, when it did
  lastAuthError: null, // why it refused this socket before it was ready (a new session)
  typingTimer: null,
  boxThread: null, // the conversation whose draft the message box holds
};

function loadOutbox() {
  try {
    const items = JSON.parse(storageGet(KEY.outbox) || "[]");
    return Array.isArray(items) ? items.filter((m) => m && m.client_id && m.thread_id) : [];
  } catch {
    return [];
  }
}
function writeOutbox(items) {
  storageSet(KEY.outbox, items.length ? JSON.stringify(items) : null);
}

// Messages that will not go out as they are: the server refused them, or the session or the
// conversation they were typed in is gone (a wiped store, another token's link). Shared by the
// tabs and kept across reloads like the outbox: what the user typed is never lost in silence.
function loadUnsent() {
  try {
    const items = JSON.parse(storageGet(KEY.unsent) || "[]");
    const usable = (m) => m && m.client_id && typeof m.text === "string";
    return Array.isArray(items) ? items.filter(usable) : [];
  } catch {
    return [];
  }
}
function keepUnsent(items, reason, { detach = false } = {}) {
  if (!items.length) return;
  const fresh = items.map((m) => ({
    client_id: m.client_id,
    text: m.text,
    reason,
    // Detached: its conversation is gone, so it shows in whichever one is open.
    thread_id: detach ? null : m.thread_id,
  }));
  const ids = new Set(fresh.map((m) => m.client_id));
  const kept = [...loadUnsent().filter((m) => !ids.has(m.client_id)), ...fresh];
  storageSet(KEY.unsent, JSON.stringify(kept));
  state.failed = kept;
}
function forgetUnsent(clientId) {
  const kept = loadUnsent().filter((m) => m.client_id !== clientId);
  storageSet(KEY.unsent, kept.length ? JSON.stringify(kept) : null);
  state.failed = kept;
}
// The draft of each conversation: what its message box holds, unsent. Written as it is typed (a
// crashed tab loses nothing), and only here: nothing of it goes to the server until it is sent.
// Stored as `{text, at}`: when it was last typed in, so one nobody can reach again expires.
function saveDraft() {
  const text = ui.input.value;
  const draft = text ? JSON.stringify({ text, at: Date.now() }) : null;
  if (state.boxThread) storageSet(KEY.draft + state.boxThread, draft);
}
/** The draft a stored value holds: `{text, at}` (`at` 0 when unknown), or null. */
function parseDraft(raw) {
  if (!raw) return null;
  try {
    const draft = JSON.parse(raw);
    if (draft && typeof draft.text === "string" && Number.isFinite(draft.at)) return draft;
  } catch {
    /* not one of ours: the text as it is */
  }
  return { text: raw, at: 0 };
}
function loadDraft(threadId) {
  return parseDraft(storageGet(KEY.draft + threadId))?.text ?? null;
}

/** Drafts no box will show again leave storage, where they piled up for good: this session's of
 * a conversation the server no longer lists (a wiped store), at once; another session's (another
 * token's link, a session replaced), once untouched for `DRAFT_KEPT_MS`, as a tab of that
 * session may still be open. The box's own stays: `showDraft` carries it on. */
function expireDrafts(known) {
  let keys = [];
  try {
    keys = Object.keys(localStorage).filter((k) => k.startsWith(KEY.draft));
  } catch {
    return; // no storage: nothing kept either
  }
  const now = Date.now();
  for (const key of keys) {
    const threadId = key.slice(KEY.draft.length);
    if (threadId === state.boxThread) continue;
    const stale = threadId.startsWith(`${state.sessionId}.`)
      ? !known.has(threadId)
      : now - (parseDraft(storageGet(key))?.at ?? 0) > DRAFT_KEPT_MS;
    if (stale) storageSet(key, null);
  }
}

/** Put the draft of `threadId` in the message box (the one shown stays saved under its own
 * conversation). What the box holds for no conversation, or for one gone from the server (a
 * wiped store, a new session), goes on into `threadId`'s box when that has no draft. */
function showDraft(threadId) {
  if (state.boxThread === threadId) return;
  const typed = ui.input.value;
  const gone =
    !state.boxThread || !state.conversations.some((c) => c.thread_id === state.boxThread);
  if (gone && state.boxThread) storageSet(KEY.draft + state.boxThread, null);
  const draft = threadId ? loadDraft(threadId) : null;
  let text = draft ?? "";
  if (gone && typed && typed !== text) text = text ? `${text}\n${typed}` : typed;
  state.boxThread = threadId;
  ui.input.value = text;
  saveDraft();
  autosize();
  checkLength();
}

// Every tab of the browser shares the stored outbox: each change is read-modify-write of the
// stored list, never a copy of this tab's own, so a tab that reconnects later does not wipe
// what another tab (perhaps closed since) is still waiting to send.
function addToOutbox(item) {
  state.outbox.push(item);
  writeOutbox([...loadOutbox().filter((m) => m.client_id !== item.client_id), item]);
}
function dropFromOutbox(unwanted) {
  const before = state.outbox.length;
  state.outbox = state.outbox.filter((m) => !unwanted(m));
  const stored = loadOutbox();
  const kept = stored.filter((m) => !unwanted(m));
  if (kept.length !== stored.length) writeOutbox(kept);
  return before !== state.outbox.length;
}
// Another tab added or sent something: take its outbox over. What it typed is its own to send
// (`transmit` leaves it to that tab, and takes it over if that tab goes before it could).
window.addEventListener("storage", (event) => {
  if (state.boxThread && event.key === KEY.draft + state.boxThread) {
    // Typed (or sent) in another tab of the same conversation: a storage event never comes to
    // the tab that wrote, so this box is not the one being typed in. Mirrored, so a message
    // sent from that tab does not stay in this box, to be sent twice.
    const text = parseDraft(event.newValue)?.text ?? "";
    if (ui.input.value !== text) {
      ui.input.value = text;
      autosize();
      checkLength();
    }
    return;
  }
  if (event.key === KEY.unsent) {
    state.failed = loadUnsent();
    renderThread();
    return;
  }
  if (event.key !== KEY.outbox) return;
  const mine = new Set(state.outbox.map((m) => m.client_id));
  state.outbox = loadOutbox();
  for (const item of state.outbox) if (!mine.has(item.client_id)) transmit(item);
  renderThread();
});

// Which tab sends a message: the one it was typed in (`tab`), while that tab lives, so a message
// goes out once, not once per open tab. Each tab holds a Web Lock named after itself for its whole
// life; another tab asks for that lock to learn when it is gone (closed, reloaded, crashed) and
// then sends what it left. Without Web Locks (plain http from another host than localhost), every
// tab sends everything: the client id keeps a second copy from making a second turn.
const TAB = randomId();
const tabLocks = navigator.locks ?? null;
const tabLock = (tab) => `talkbridge.tab.${tab}`;
if (tabLocks) tabLocks.request(tabLock(TAB), () => new Promise(() => {}));

function sentByThisTab(item) {
  return !tabLocks || !item.tab || item.tab === TAB;
}

const watchedTabs = new Set();
/** Take over `tab`'s messages once it is gone: the lock is granted then (at once if it is). */
function watchTab(tab) {
  if (watchedTabs.has(tab)) return;
  watchedTabs.add(tab);
  tabLocks.request(tabLock(tab), () => adoptFrom(tab));
}

function adoptFrom(tab) {
  const stored = loadOutbox();
  const left = new Set(stored.filter((m) => m.tab === tab).map((m) => m.client_id));
  writeOutbox(stored.map((m) => (left.has(m.client_id) ? { ...m, tab: TAB } : m)));
  state.outbox = loadOutbox();
  for (const item of state.outbox) if (left.has(item.client_id)) transmit(item);
  renderThread();
}

function randomId() {
  const bytes = new Uint8Array(16);
  crypto.getRandomValues(bytes);
  return Array.from(bytes, (b) => b.toString(16).padStart(2, "0")).join("");
}

function thread(threadId) {
  let t = state.threads.get(threadId);
  if (!t) {
    t = {
      messages: new Map(), // seq -> message frame
      order: [], // the seqs of `messages`, ascending
      streams: new Map(), // stream_id -> { text, node, shown }
      loaded: false,
      floor: 0,
      earlier: false, // the server holds older messages than the first one shown
      loadingEarlier: false,
      unread: 0,
      typingUntil: 0, // the assistant prepares a reply here until then (Date.now() time)
    };
    state.threads.set(threadId, t);
  }
  return t;
}

/** Highest seq up to which this page has every message: where a resume starts. */
function resumeSeq(t) {
  let seq = t.floor;
  while (t.messages.has(seq + 1)) seq += 1;
  return seq;
}

// ---- connection -----------------------------------------------------------------------------

function send(frame) {
  if (state.ws && state.ws.readyState === WebSocket.OPEN) {
    state.ws.send(JSON.stringify(frame));
    return true;
  }
  return false;
}

// History requests under way by ref: one the rate limit dropped (a page resuming many threads
// at once after a reconnect) or the server failed on (its store blinked) is asked again when
// the server says, not lost: a resume that is never answered leaves out what came meanwhile.
const historyAsked = new Map();
let historyRefs = 0;
function askHistory(frame) {
  historyRefs += 1;
  const ref = `h${historyRefs}`;
  historyAsked.set(ref, frame);
  return send({ ...frame, ref });
}
function askHistoryAgain(frame) {
  const asked = frame.ref && historyAsked.get(frame.ref);
  if (!asked) return false;
  if (frame.code === "rate_limited" || frame.code === "internal") {
    const wait = Math.max(0.1, Number(frame.retry_after) || 1) * 1000;
    const ws = state.ws;
    setTimeout(() => {
      if (state.ws === ws && historyAsked.has(frame.ref)) send({ ...asked, ref: frame.ref });
    }, wait);
    return true;
  }
  historyAsked.delete(frame.ref);
  return false;
}

function connect() {
  clearTimeout(state.reconnectTimer);
  state.reconnectTimer = null;
  stopCountdown();
  setStatus("connecting", state.attempt ? "Reconnecting…" : "Connecting…");
  const scheme = location.protocol === "https:" ? "wss:" : "ws:";
  const ws = new WebSocket(`${scheme}//${location.host}/ws`);
  state.ws = ws;
  ws.addEventListener("open", () => {
    // Without a saved token the socket logs in with the cookie the link left (it came along).
    const auth = state.token ? { type: "auth", token: state.token } : { type: "auth" };
    if (state.sessionId) auth.session_id = state.sessionId;
    ws.send(JSON.stringify(auth));
  });
  ws.addEventListener("message", (event) => {
    let frame;
    try {
      frame = JSON.parse(event.data);
    } catch {
      return;
    }
    if (frame && typeof frame.type === "string") handle(frame);
  });
  ws.addEventListener("close", (event) => {
    if (state.ws !== ws) return;
    stopHeartbeat();
    state.ws = null;
    state.ready = false;
    renderComposerState();
    if (event.code === 4401 && !state.token) {
      showFatal(
        "This link has no access token",
        "Open the full URL that talkbridge run printed in its terminal (it ends in ?token=…).",
      );
      return;
    }
    if (event.code === 4401 && state.refusal) {
      // The server said why (an expired sign-in, a replaced token): its words, not a guess.
      showFatal("This access token is not accepted", `${capitalize(state.refusal)}.`);
      return;
    }
    if (event.code === 4401) {
      showFatal(
        "This access token is not valid",
        "The webchat refused the token in this link. Open the URL that talkbridge run printed " +
          "in its terminal, or ask the person who runs this bridge for a new link.",
      );
      return;
    }
    if (event.code === 4403) {
      // Our stored session belongs to another token: start a fresh one right away.
      resetSession();
      connect();
      return;
    }
    if (event.code === 4429) {
      showFatal(
        "This link cannot start another session",
        `${capitalize(state.lastAuthError || "the webchat refused a new session")}.`,
      );
      return;
    }
    scheduleReconnect();
  });
}

/** A ping every 20 s; no pong within 10 s means the network is gone even if the socket never
 * closed (a laptop lid, a lost Wi-Fi): drop it and reconnect, so the status tells the truth
 * and the outbox goes out as soon as the network is back. */
function startHeartbeat(ws) {
  stopHeartbeat();
  state.heartbeat = setInterval(() => {
    if (state.ws !== ws || state.pongTimer) return;
    send({ type: "ping", ref: "heartbeat" });
    state.pongTimer = setTimeout(() => dropConnection(ws), PONG_WITHIN_MS);
  }, PING_EVERY_MS);
}

function stopHeartbeat() {
  clearInterval(state.heartbeat);
  clearTimeout(state.pongTimer);
  state.heartbeat = null;
  state.pongTimer = null;
}

function onPong() {
  clearTimeout(state.pongTimer);
  state.pongTimer = null;
}

function dropConnection(ws) {
  if (state.ws !== ws) return;
  stopHeartbeat();
  state.ws = null; // its close event, whenever it comes, is ignored
  state.ready = false;
  renderComposerState();
  try {
    ws.close();
  } catch {
    /* already closing */
  }
  scheduleReconnect();
}

function scheduleReconnect() {
  clearTimeout(state.reconnectTimer); // one attempt waits at a time
  state.reconnectTimer = null;
  if (!navigator.onLine) {
    // The browser knows there is no network: wait for its "online" event instead of polling.
    setStatus("offline", "No network: messages wait until it is back");
    return;
  }
  const ceiling = Math.min(BACKOFF_CAP_MS, BACKOFF_BASE_MS * 2 ** state.attempt);
  const delay = Math.round(ceiling / 2 + (Math.random() * ceiling) / 2);
  state.attempt += 1;
  state.reconnectAt = Date.now() + delay;
  state.reconnectTimer = setTimeout(connect, delay);
  // Told once to a screen reader; the seconds then count down on the screen only (a live
  // region changed every second would be read out every second).
  ui.statusText.replaceChildren(
    Object.assign(document.createElement("span"), {
      className: "visually-hidden",
      textContent: "Not connected; reconnecting shortly.",
    }),
    Object.assign(document.createElement("span"), { id: "countdown" }),
  );
  ui.statusText.lastChild.setAttribute("aria-hidden", "true");
  ui.status.dataset.state = "offline";
  ui.retry.hidden = false;
  countDown();
}

/** "Reconnecting in N s…", N going down each second until the page tries again. */
function countDown() {
  clearTimeout(state.countdownTimer);
  const left = state.reconnectAt - Date.now();
  const shown = $("countdown");
  if (!shown || state.reconnectTimer === null) return;
  const seconds = Math.max(1, Math.ceil(left / 1000));
  shown.textContent = `Reconnecting in ${seconds} s…`;
  // Next when the number changes: as `left` passes the whole second below it.
  if (seconds > 1) state.countdownTimer = setTimeout(countDown, left - (seconds - 1) * 1000);
}

function stopCountdown() {
  clearTimeout(state.countdownTimer);
  state.countdownTimer = null;
  ui.retry.hidden = true;
}

function resetSession() {
  // What waited to be sent belongs to the old session's conversations: kept as "Not sent",
  // to send again in the new one, never dropped.
  keepUnsent(loadOutbox(), "the chat started a new session before the bridge confirmed it", {
    detach: true,
  });
  state.sessionId = null;
  state.active = null;
  state.conversations = [];
  state.threads.clear();
  state.outbox = [];
  writeOutbox([]);
  storageSet(KEY.session, null);
  storageSet(KEY.active, null);
}

// ---- frames ---------------------------------------------------------------------------------

function handle(frame) {
  switch (frame.type) {
    case "ready":
      return onReady(frame);
    case "ack":
      return onAck(frame);
    case "message":
      return onMessage(frame);
    case "delta":
      return onDelta(frame);
    case "stream_end":
      return onStreamEnd(frame);
    case "typing":
      return onTyping(frame);
    case "history":
      return onHistory(frame);
    case "conversation":
      return onConversation(frame);
    case "error":
      return onError(frame);
    case "pong":
      return onPong();
    default:
      return undefined;
  }
}

function onReady(frame) {
  historyAsked.clear(); // asked on the previous socket: asked again below
  if (state.sessionId && state.sessionId !== frame.session_id) resetSession();
  state.sessionId = frame.session_id;
  storageSet(KEY.session, frame.session_id);
  state.ready = true;
  state.attempt = 0;
  if (frame.limits) state.limits = frame.limits;
  checkLength(); // what waits in the box, against this server's limit
  state.conversations = frame.conversations || [];
  const known = new Set(state.conversations.map((c) => c.thread_id));
  // Taken from storage again: another tab may have added to it while this one was away.
  state.outbox = loadOutbox();
  const orphans = state.outbox.filter((m) => !known.has(m.thread_id));
  keepUnsent(orphans, "its conversation is no longer on the server", { detach: true });
  dropFromOutbox((m) => !known.has(m.thread_id));
  if (!known.has(state.active)) state.active = newest()?.thread_id ?? null;
  // Replies that were streaming when the connection dropped: the history answer brings each
  // one still under way from its start, and a reply cut off by a restart never ends otherwise.
  for (const t of state.threads.values()) t.streams.clear();
  setStatus("online", "Connected");
  startHeartbeat(state.ws);
  renderConversations();
  // Resume every thread we already show, from the last seq we hold without a gap.
  for (const [threadId, t] of state.threads) {
    if (t.loaded && known.has(threadId)) {
      askHistory({ type: "history", thread_id: threadId, after_seq: resumeSeq(t) });
    }
  }
  if (state.active) switchTo(state.active);
  expireDrafts(known);
  for (const item of state.outbox) transmit(item);
  renderComposerState();
  if (document.activeElement === document.body) ui.input.focus(); // ready to type
}

function onAck(frame) {
  const item = state.outbox.find((m) => m.client_id === frame.client_id);
  if (!item) return;
  dropFromOutbox((m) => m.client_id === item.client_id);
  // Acknowledged without its message frame (a resend of one this page never saw stored):
  // show it from the outbox until history brings the stored one.
  const fresh = addMessages(frame.thread_id, [
    {
      type: "message", thread_id: frame.thread_id, seq: frame.seq, id: frame.id, role: "user",
      text: item.text, client_id: item.client_id, ts: new Date().toISOString(),
    },
  ]);
  if (frame.thread_id === state.active) renderThread({ fresh });
}

function onMessage(frame) {
  const t = thread(frame.thread_id);
  let changed = false;
  if (frame.client_id) {
    if (dropFromOutbox((m) => m.client_id === frame.client_id)) changed = true;
  }
  if (frame.stream_id && t.streams.size) {
    t.streams.clear(); // the streamed reply is here; any other stream left was cut off
    changed = true;
  }
  if (frame.role !== "user") stopTyping(frame.thread_id);
  const fresh = addMessages(frame.thread_id, [frame]);
  if (fresh && frame.role !== "user" && frame.thread_id === state.active) {
    announce(`${frame.role === "system" ? "Notice" : "Assistant"}: ${brief(frame.text)}`);
  }
  if (frame.thread_id === state.active) {
    // Not followed even when it is the user's own, typed in another tab or on another device:
    // a reader scrolled up stays where they are (this tab's own messages follow in `queue`).
    if (fresh || changed) renderThread({ fresh });
  } else if (fresh && frame.role === "assistant") {
    t.unread += 1;
    renderConversations();
  }
}

function onDelta(frame) {
  const t = thread(frame.thread_id);
  let stream = t.streams.get(frame.stream_id);
  if (!stream) {
    // A thread runs one turn at a time: another stream still shown was cut off (a node
    // stopped mid-reply, and the turn runs again under a new stream).
    t.streams.clear();
    stream = { text: "", node: null, shown: null };
    t.streams.set(frame.stream_id, stream);
  }
  // `from_start`: the reply so far, for a page that joined mid-stream (it replaces, not adds).
  if (frame.from_start) stream.restart = true;
  stream.text = frame.from_start ? frame.text : stream.text + frame.text;
  stopTyping(frame.thread_id);
  if (frame.thread_id === state.active) drawSoon();
}

function onStreamEnd(frame) {
  // The reply streamed there ends without its final message (it went out before, or the turn
  // was cut off and runs again): what was shown of it goes.
  const t = thread(frame.thread_id);
  if (t.streams.delete(frame.stream_id) && frame.thread_id === state.active) renderThread();
}

// Kept per thread: a notice for a conversation not shown is shown once the user opens it,
// while it still holds (the server does not send it again once a reply streams).
function onTyping(frame) {
  thread(frame.thread_id).typingUntil = Date.now() + TYPING_MS;
  if (frame.thread_id === state.active) showTyping();
}

/** Show the notice when the assistant prepares a reply in the conversation shown, for as long
 * as that holds. */
function showTyping() {
  const left = (state.threads.get(state.active)?.typingUntil ?? 0) - Date.now();
  if (left <= 0) return;
  if (ui.typing.hidden) announce("The assistant is typing…");
  ui.typing.hidden = false;
  clearTimeout(state.typingTimer);
  state.typingTimer = setTimeout(hideTyping, left);
}

/** The reply of `threadId` streams or came: the notice is over there. */
function stopTyping(threadId) {
  const t = state.threads.get(threadId);
  if (t) t.typingUntil = 0;
  if (threadId === state.active) hideTyping();
}

function hideTyping() {
  clearTimeout(state.typingTimer);
  ui.typing.hidden = true;
}

function onHistory(frame) {
  if (frame.ref) historyAsked.delete(frame.ref);
  const t = thread(frame.thread_id);
  const messages = frame.messages || [];
  const back = frame.before_seq !== undefined;
  // `after_seq: 0` is answered with the latest page, on a first load and on the resume of a
  // thread this page held nothing of alike: what came before that page is `earlier`.
  if (back || frame.after_seq === 0) {
    t.floor = messages.length ? messages[0].seq - 1 : 0;
    t.earlier = Boolean(frame.earlier);
    t.loadingEarlier = false;
  }
  const first = !t.loaded;
  t.loaded = true;
  const stored = new Set();
  for (const m of messages) {
    if (m.stream_id) t.streams.delete(m.stream_id);
    if (m.client_id) stored.add(m.client_id);
  }
  dropFromOutbox((m) => stored.has(m.client_id));
  if (frame.more && messages.length) {
    askHistory({ type: "history", thread_id: frame.thread_id, after_seq: messages.at(-1).seq });
  }
  const fresh = addMessages(frame.thread_id, messages);
  if (frame.thread_id !== state.active) return;
  if (back) {
    renderThread();
    showEarlier(); // older ones go in above the reader, who stays put
  } else {
    // A first load opens at the newest; a resume after a reconnect leaves the reader be.
    renderThread({ follow: first, fresh });
  }
}

function loadEarlier() {
  const t = thread(state.active);
  const first = t.order[0];
  if (t.loadingEarlier || first === undefined) return;
  t.loadingEarlier = askHistory({
    type: "history",
    thread_id: state.active,
    before_seq: first,
    limit: state.limits.history_limit || 200,
  });
  renderThread();
}

function onConversation(frame) {
  const conv = frame.conversation;
  const index = state.conversations.findIndex((c) => c.thread_id === conv.thread_id);
  if (index >= 0) state.conversations[index] = conv;
  else state.conversations.push(conv);
  if (frame.ref && frame.ref === state.pendingConversation) {
    state.pendingConversation = null;
    switchTo(conv.thread_id);
    closeSidebar();
    ui.input.focus();
  } else {
    renderConversations();
    if (conv.thread_id === state.active) ui.title.textContent = titleOf(conv);
  }
}

function capitalize(text) {
  return text.charAt(0).toUpperCase() + text.slice(1);
}

function onError(frame) {
  if (frame.code === "unauthorized") state.refusal = frame.message;
  if (!state.ready) {
    // About the auth: the socket closes, and its close code says what the page does (a page
    // that explains, or a new session at once).
    state.lastAuthError = frame.message;
    return;
  }
  // The socket closes after these: its close code shows the page that explains.
  if (frame.code === "unauthorized" || frame.code === "too_many_sessions") return;
  if (frame.ref === "heartbeat") {
    onPong(); // dropped or failed, yet answered: the connection is alive
    return;
  }
  if (askHistoryAgain(frame)) return;
  if (frame.ref && frame.ref === state.pendingConversation) state.pendingConversation = null;
  if (frame.client_id) {
    const item = state.outbox.find((m) => m.client_id === frame.client_id);
    if (frame.code === "rate_limited" || frame.code === "internal") {
      const wait = Math.max(1, Number(frame.retry_after) || 2) * 1000;
      if (item) setTimeout(() => transmit(item), wait);
      notify(
        frame.code === "rate_limited"
          ? "Messages are going out faster than the bridge takes them; " +
              "yours will be sent again in a moment."
          : "The bridge had a problem taking your message; it will be sent again in a moment.",
      );
      return;
    }
    if (item) {
      const why = whyNotSent(frame);
      keepUnsent([item], why);
      dropFromOutbox((m) => m.client_id === item.client_id);
      if (item.thread_id === state.active) renderThread();
      notify(`Your message was not sent: ${why}. It stays here to send again or copy.`);
    }
    return;
  }
  notify(errorText(frame));
}

/** Why the bridge refused a message, in words for the person who typed it (the server's own
 * words, which name frames and fields, are for whoever runs it, and stay in the page's console). */
function whyNotSent(frame) {
  if (frame.message) console.info(`talkbridge: ${frame.code}: ${frame.message}`);
  switch (frame.code) {
    case "too_large":
      return (
        `it is too long for the bridge (at most ${state.limits.max_frame_bytes.toLocaleString()}` +
        " bytes): shorten it or split it into several messages"
      );
    case "empty_message":
      return "it shows nothing: only spaces or invisible characters";
    case "forbidden":
      return "its conversation belongs to another session";
    case "not_found":
      return "its conversation is no longer on the bridge";
    case "bad_frame":
      return "the bridge could not read it; reloading the page may help";
    default:
      return "the bridge refused it";
  }
}

/** An error about no message of the user's (a conversation to start, a page of history). */
function errorText(frame) {
  if (frame.message) console.info(`talkbridge: ${frame.code}: ${frame.message}`);
  switch (frame.code) {
    case "too_large":
      return /conversations/.test(frame.message ?? "")
        ? "No new conversation: this chat already holds as many as it can. Carry on in one of them."
        : "That was too large for the bridge to take.";
    case "forbidden":
      return "That conversation belongs to another session: it cannot be opened here.";
    case "not_found":
      return "That conversation is no longer on the bridge.";
    case "rate_limited":
      return `The bridge is busy: try again in ${Math.ceil(Number(frame.retry_after) || 1)} s.`;
    case "internal":
      return "The bridge had a problem; try again in a moment.";
    case "bad_frame":
      return "The bridge could not read a request from this page; reloading the page may help.";
    default:
      return "Something went wrong; try again in a moment.";
  }
}

// ---- actions --------------------------------------------------------------------------------

function transmit(item) {
  if (!sentByThisTab(item)) {
    watchTab(item.tab);
    return;
  }
  if (!state.ready) return;
  send({ type: "send", thread_id: item.thread_id, client_id: item.client_id, text: item.text });
}

/** Whether `text` shows anything: not only spaces and invisible characters (zero-width spaces,
 * joiners, direction marks), which the server refuses as `empty_message`. */
function visible(text) {
  return /[^\p{C}\p{Z}\s]/u.test(text);
}

function submit() {
  const text = ui.input.value.replace(/\s+$/, "");
  if (!state.active) return;
  if (!visible(text)) {
    if (text) notify("Nothing to send: the message is only spaces or invisible characters.");
    return;
  }
  if (queue(text)) {
    // In the outbox now (stored, and sent from there after a reload): no longer a draft.
    ui.input.value = "";
    saveDraft();
    autosize();
    checkLength();
  }
}

/** Send `text` in the conversation shown (from the message box, or a "Not sent" one again). */
function queue(text) {
  const size = sendSize(text);
  if (size > state.limits.max_frame_bytes) {
    notify(`That message is not sent. ${tooLongText(size)}`);
    return false;
  }
  const item = { thread_id: state.active, client_id: randomId(), text, tab: TAB };
  addToOutbox(item);
  transmit(item);
  renderThread({ follow: true });
  return true;
}

function sendAgain(item) {
  if (!state.active) {
    notify("Open a conversation first; the message stays here meanwhile.");
    return;
  }
  if (queue(item.text)) forgetUnsent(item.client_id);
}

async function copyText(item) {
  try {
    await navigator.clipboard.writeText(item.text);
    notify("Copied.");
  } catch {
    // No clipboard (plain http from another host): into the message box, where it can be copied.
    ui.input.value = ui.input.value ? `${ui.input.value}\n${item.text}` : item.text;
    saveDraft();
    autosize();
    ui.input.focus();
    notify("The message is back in the message box.");
  }
}

function startConversation() {
  if (!state.ready) {
    notify("Not connected yet; try again in a moment.");
    return;
  }
  // An untitled conversation has no message yet: use it rather than pile up empty ones.
  const blank = state.conversations.find(
    (c) => !c.title && !state.outbox.some((m) => m.thread_id === c.thread_id),
  );
  if (blank) {
    switchTo(blank.thread_id);
    closeSidebar();
    ui.input.focus();
    return;
  }
  state.pendingConversation = randomId();
  send({ type: "new_conversation", ref: state.pendingConversation });
}

function switchTo(threadId) {
  state.active = threadId;
  storageSet(KEY.active, threadId);
  showDraft(threadId);
  const t = thread(threadId);
  t.unread = 0;
  hideTyping();
  showTyping(); // the assistant may be preparing a reply there
  const conv = state.conversations.find((c) => c.thread_id === threadId);
  ui.title.textContent = conv ? titleOf(conv) : "Conversation";
  renderConversations();
  renderThread(); // another thread opens at its newest; the one shown (a reconnect) stays put
  if (!t.loaded && state.ready) askHistory({ type: "history", thread_id: threadId, after_seq: 0 });
}

// ---- rendering ------------------------------------------------------------------------------

function titleOf(conv) {
  return conv.title || "New conversation";
}

function newest() {
  return [...state.conversations].sort((a, b) => b.created_at.localeCompare(a.created_at))[0];
}

// Each conversation keeps its list item while the list changes around it (a title, an unread
// count, a new one on top): a keyboard user's focus on one stays when a message comes elsewhere.
const listItems = new Map(); // thread_id -> { li, button, name, when, dot }

function renderConversations() {
  const items = [...state.conversations].sort((a, b) => b.created_at.localeCompare(a.created_at));
  const shown = new Set(items.map((conv) => conv.thread_id));
  for (const threadId of listItems.keys()) if (!shown.has(threadId)) listItems.delete(threadId);
  placeChildren(
    ui.list,
    items.map((conv) => conversationItem(conv)),
  );
}

function conversationItem(conv) {
  let item = listItems.get(conv.thread_id);
  if (!item) {
    const li = document.createElement("li");
    const button = document.createElement("button");
    button.type = "button";
    button.className = "conversation";
    const name = document.createElement("span");
    name.className = "conversation-title";
    name.dir = "auto";
    const when = document.createElement("span");
    when.className = "conversation-date";
    const dot = document.createElement("span");
    dot.className = "unread";
    button.append(name, when);
    button.addEventListener("click", () => {
      switchTo(conv.thread_id);
      closeSidebar();
      ui.input.focus();
    });
    li.append(button);
    item = { li, button, name, when, dot };
    listItems.set(conv.thread_id, item);
  }
  const active = conv.thread_id === state.active;
  if (active) item.button.setAttribute("aria-current", "true");
  else item.button.removeAttribute("aria-current");
  item.name.textContent = titleOf(conv);
  item.when.textContent = formatDate(conv.created_at);
  const unread = state.threads.get(conv.thread_id)?.unread ?? 0;
  if (unread && !active) {
    item.dot.textContent = String(unread);
    item.dot.setAttribute("aria-label", `${unread} new`);
    item.button.append(item.dot);
  } else item.dot.remove();
  return item.li;
}

function messageNode(role, content, meta, extraClass = "") {
  const article = document.createElement("article");
  article.className = `msg msg-${role === "user" ? "user" : "assistant"} ${extraClass}`.trim();
  const who = document.createElement("span");
  who.className = "visually-hidden";
  who.textContent = role === "user" ? "You said:" : "Assistant said:";
  const bubble = document.createElement("div");
  bubble.className = "bubble";
  bubble.dir = "auto"; // Arabic or Hebrew reads right to left, in its own direction
  bubble.append(content);
  article.append(who, bubble);
  if (meta) {
    const footer = document.createElement("div");
    footer.className = "meta";
    footer.textContent = meta;
    article.append(footer);
  }
  return article;
}

// A note from the bridge about the conversation, not a message of anyone in it: small and muted.
// Each follows a message of the user's that no one will answer here, and says which when
// another message came between them: `not_answered` (a hook of the bridge dropped it),
// `forwarded` (a hook passed it on, never saying where).
const NOTES = {
  not_answered: { label: "Not answered", title: "No reply will come to this message." },
  forwarded: {
    label: "Passed on",
    title: "The bridge passed this message on instead of answering it here.",
  },
};
function noteNode(t, m) {
  const article = document.createElement("article");
  const known = Object.hasOwn(NOTES, m.code) ? NOTES[m.code] : null;
  const about = known && m.reply_to ? shownBefore(t, m.seq, m.reply_to) : null;
  article.className = `msg msg-note${about !== null ? " msg-note-user" : ""}`;
  if (m.code) article.dataset.code = m.code;
  const note = document.createElement("p");
  note.className = "note";
  note.dir = "auto";
  if (known) {
    note.textContent = about ? `${known.label}: “${about}”` : known.label;
    note.title = known.title;
  } else note.textContent = m.text;
  article.append(note);
  return article;
}

/** Whether the message `id` is shown before `seq`: "" when right before it (or only other notes
 * about it between: "Passed on", then "Not answered" when that forward failed), else a short
 * quote of it to name it by; null when this page does not hold it. */
function shownBefore(t, seq, id) {
  const at = lowerBound(t.order, seq);
  let between = false;
  for (let i = at - 1; i >= 0; i -= 1) {
    const m = t.messages.get(t.order[i]);
    if (m && m.id === id) {
      if (!between) return "";
      const text = m.text.replace(/\s+/g, " ").trim();
      return text.length > 40 ? `${text.slice(0, 39)}…` : text;
    }
    if (!m || m.role !== "system" || m.reply_to !== id) between = true;
  }
  return null;
}

function unsentNode(item) {
  const node = messageNode("user", renderPlain(item.text), `Not sent: ${item.reason}`, "failed");
  node.dataset.client = item.client_id;
  const actions = document.createElement("div");
  actions.className = "unsent-actions";
  const button = (label, action) => {
    const b = Object.assign(document.createElement("button"), { type: "button" });
    b.textContent = label;
    b.addEventListener("click", action);
    return b;
  };
  actions.append(
    button("Send again", () => sendAgain(item)),
    button("Copy", () => copyText(item)),
    button("Dismiss", () => {
      forgetUnsent(item.client_id);
      renderThread();
    }),
  );
  node.append(actions);
  return node;
}

function render(role, text, markup) {
  return role === "user" || markup === "plain" ? renderPlain(text) : renderMarkdown(text);
}

// The thread shown is patched, never rebuilt while it is shown: a frame adds or changes its own
// node, so an earlier message keeps its node (a selection in it, focus, the reader's place).
// Only a window of the thread is in the document: its newest PAGE messages when it opens, more
// as the reader scrolls up (held here, or asked for with `before_seq`) or back down, never more
// than MAX_SHOWN: the messages farthest from the reader leave the document, and the reader stays
// where they are. So a thread of 20,000 messages costs what one of a few hundred does, to open,
// to scroll and to stream a reply into. `#messages` holds: the "earlier" button, the window's
// messages by seq, `tailStart`, then (when the window reaches the newest message) what has no
// seq yet (replies streaming, messages waiting to be sent, messages not sent) or the empty note.
// A reader at the bottom is kept there whenever the log's height changes (a reply growing, the
// window or the phone's keyboard resizing it). While a selection reaches into the messages (being
// made, or made), no message leaves the document: the window only grows, and goes back to
// MAX_SHOWN once the selection is gone. So a selection is never cut by the window moving, but it
// reaches only the messages in the document: it cannot start in one that has left it, and the
// browser's find-in-page (Ctrl+F) finds only what the window holds.
const NEAR_BOTTOM_PX = 120;
const EARLIER_WITHIN_PX = 200; // scrolled this near the top (or bottom): the next page is drawn
const PAGE = 100; // messages drawn at a time
const MAX_SHOWN = 3 * PAGE; // messages in the document at most
const tailStart = document.createComment(" not stored yet ");
const view = {
  threadId: null,
  t: null, // the thread whose nodes #messages holds
  nodes: new Map(), // seq -> element, for the window's messages (in the document)
  lo: null, // the oldest seq of the window; null: none drawn yet (the next ones open at the newest)
  hi: Infinity, // its newest; Infinity: the window reaches the newest, new messages join it
  pinned: true, // the reader is at the bottom: new messages keep them there
  pending: new Map(), // client_id -> node of a message waiting to be sent
  unsent: new Map(), // client_id -> node of a message not sent
  wanted: null, // [lo, hi]: the window to go back to once no selection holds it open
};

function messageNodeOf(t, seq) {
  let node = view.nodes.get(seq);
  if (!node) {
    const m = t.messages.get(seq);
    node =
      m.role === "system"
        ? noteNode(t, m)
        : messageNode(m.role, render(m.role, m.text, m.markup), formatTime(m.ts));
    node.dataset.seq = String(seq);
    view.nodes.set(seq, node);
  }
  return node;
}

/** Make the window [lo, hi] of the thread shown: the nodes outside it leave the document, the
 * missing ones inside it are made and put in their places; the others are left alone. While a
 * selection reaches into the messages, none leaves: the window spans both, until it is gone. */
function setWindow(lo, hi) {
  const t = view.t;
  view.wanted = null;
  if (view.lo !== null && (view.lo < lo || view.hi > hi) && selectionInLog()) {
    view.wanted = [lo, hi];
    lo = Math.min(lo, view.lo);
    hi = Math.max(hi, view.hi);
  }
  for (const [seq, node] of view.nodes) {
    if (seq < lo || seq > hi) {
      // A link focused in a message that leaves: the keyboard stays in the messages.
      if (node.contains(document.activeElement)) ui.messages.focus({ preventScroll: true });
      node.remove();
      view.nodes.delete(seq);
    }
  }
  view.lo = lo;
  view.hi = hi;
  let next = tailStart;
  for (let i = upTo(t.order, hi) - 1; i >= 0 && t.order[i] >= lo; i -= 1) {
    const seq = t.order[i];
    const node = view.nodes.get(seq);
    if (node) next = node;
    else next = ui.log.insertBefore(messageNodeOf(t, seq), next);
  }
}

/** Whether text is selected (being selected, or left selected) in the messages. */
function selectionInLog() {
  const selection = document.getSelection();
  if (!selection || selection.isCollapsed || !selection.rangeCount) return false;
  return selection.getRangeAt(0).intersectsNode(ui.log);
}

/** The selection that held the window open is gone: it shrinks to the one wanted meanwhile,
 * the reader kept in place. */
function onSelectionChange() {
  if (!view.wanted || !view.t || selectionInLog()) return;
  const [lo, hi] = view.wanted;
  keepingPlace(() => {
    setWindow(lo, hi);
    renderEarlier(view.t);
    renderTail(view.t);
  });
  if (view.pinned) ui.messages.scrollTop = ui.messages.scrollHeight;
}

/** The index in ascending `order` past its last item not above `seq`. */
function upTo(order, seq) {
  return seq === Infinity ? order.length : lowerBound(order, seq + 1);
}

/** The window of the newest PAGE messages of the thread shown. */
function newestWindow() {
  const { order } = view.t;
  return order.length ? [order[Math.max(0, order.length - PAGE)], Infinity] : [null, Infinity];
}

/** Run `change` (which adds or removes messages above the reader) with the message at the top
 * of the reader's view kept where it is on the screen. */
function keepingPlace(change) {
  const box = ui.messages;
  const top = box.getBoundingClientRect().top;
  const { order } = view.t;
  let anchor = null;
  for (let i = lowerBound(order, view.lo ?? 0); i < order.length && order[i] <= view.hi; i += 1) {
    const node = view.nodes.get(order[i]);
    if (node && node.getBoundingClientRect().bottom > top) {
      anchor = node;
      break;
    }
  }
  const before = anchor?.getBoundingClientRect().top;
  change();
  if (anchor?.isConnected) box.scrollTop += anchor.getBoundingClientRect().top - before;
}

/** Keep the frames of `threadId` this page has not seen yet (by seq) and, when that thread is
 * shown, put each one in the window in its place; returns how many were new. */
function addMessages(threadId, frames) {
  const t = thread(threadId);
  const fresh = [];
  for (const m of frames) {
    if (t.messages.has(m.seq)) continue;
    t.messages.set(m.seq, m);
    fresh.push(m.seq);
  }
  insertSeqs(t.order, fresh);
  if (t === view.t && fresh.length) {
    let [lo, hi] = view.lo === null ? newestWindow() : [view.lo, view.hi];
    const end = upTo(t.order, hi);
    if (end - lowerBound(t.order, lo) > MAX_SHOWN) {
      // Past the cap: the far end goes. A reader at the bottom follows the newest; one
      // scrolled up keeps what they read, and the newest wait below ("New messages").
      if (view.pinned && hi === Infinity) lo = t.order[end - MAX_SHOWN];
      else hi = t.order[lowerBound(t.order, lo) + MAX_SHOWN - 1];
    }
    setWindow(lo, hi);
  }
  return fresh.length;
}

/** Show the active thread: built once when it is opened, then patched. `follow`: scroll to the
 * bottom (this page's own message); else a reader scrolled up stays where they are, and told
 * when `fresh` messages came below them. */
function renderThread({ follow = false, fresh = 0 } = {}) {
  if (view.threadId !== state.active || view.t !== (state.threads.get(state.active) ?? null)) {
    buildView();
    follow = true;
  }
  if (!view.t) return;
  if (follow && view.hi !== Infinity) setWindow(...newestWindow());
  renderEarlier(view.t);
  renderTail(view.t);
  const box = ui.messages;
  if (follow || view.pinned) {
    box.scrollTop = box.scrollHeight;
    view.pinned = true;
    ui.newer.hidden = true;
  } else if (fresh) ui.newer.hidden = false;
}

function buildView() {
  view.threadId = state.active;
  view.t = state.active ? thread(state.active) : null;
  view.pinned = true;
  view.nodes = new Map();
  view.lo = null; // another thread's window, if any, is gone with its nodes
  view.hi = Infinity;
  view.wanted = null;
  ui.newer.hidden = true;
  if (!view.t) {
    ui.log.replaceChildren(ui.empty);
    return;
  }
  ui.log.replaceChildren(tailStart);
  setWindow(...newestWindow());
}

/** Whether older messages than the window's exist: held here, or on the server. */
function hasEarlier(t) {
  return t.order.length > 0 && (t.earlier || (view.lo !== null && view.lo > t.order[0]));
}

function renderEarlier(t) {
  if (!hasEarlier(t)) {
    ui.earlier.remove();
    return;
  }
  ui.earlier.disabled = t.loadingEarlier;
  ui.earlier.textContent = t.loadingEarlier ? "Loading earlier messages…" : "Show earlier messages";
  if (ui.log.firstChild !== ui.earlier) ui.log.prepend(ui.earlier);
}

function renderTail(t) {
  const nodes = [];
  // Far up a long thread (the window ends before the newest message), nothing of the tail
  // shows: it belongs after the newest message, and comes back with it.
  const atEnd = view.hi === Infinity;
  for (const [streamId, stream] of t.streams) if (atEnd) nodes.push(streamNode(streamId, stream));
  const pending = new Map();
  const label = state.ready ? "Sending…" : "Waiting for the connection…";
  for (const item of state.outbox) {
    if (item.thread_id !== state.active) continue;
    let node = view.pending.get(item.client_id);
    if (!node) {
      node = messageNode("user", renderPlain(item.text), label, "pending");
      node.dataset.client = item.client_id;
    }
    const meta = node.querySelector(".meta");
    if (meta.textContent !== label) meta.textContent = label;
    pending.set(item.client_id, node);
    if (atEnd) nodes.push(node);
  }
  view.pending = pending;
  const unsent = new Map();
  for (const item of state.failed) {
    if (item.thread_id && item.thread_id !== state.active) continue;
    const node = view.unsent.get(item.client_id) ?? unsentNode(item);
    unsent.set(item.client_id, node);
    if (atEnd) nodes.push(node);
  }
  view.unsent = unsent;
  if (!nodes.length && !t.order.length) nodes.push(ui.empty);
  placeChildren(ui.log, nodes, tailStart);
}

/** A reply streaming: its node is made once, and only what changed in its bubble is drawn
 * again: each block of the reply that is finished (followed by a blank line) is rendered once,
 * the last one again per piece. */
function streamNode(streamId, stream) {
  if (!stream.node) {
    stream.node = messageNode("assistant", document.createDocumentFragment(), "", "streaming");
    stream.node.dataset.stream = streamId;
    // Announced once, as the final message; not piece by piece while it streams.
    stream.node.setAttribute("aria-hidden", "true");
    stream.bubble = stream.node.querySelector(".bubble");
  }
  if (stream.shown !== stream.text) drawStream(stream);
  stream.shown = stream.text;
  return stream.node;
}

function drawStream(stream) {
  const text = stream.text.replace(/\r\n?/g, "\n");
  if (stream.restart) {
    // The reply so far came again (`from_start`): it may not continue what was shown.
    stream.bubble.replaceChildren();
    stream.settled = 0;
    stream.live = [];
    stream.restart = false;
  }
  const from = stream.settled ?? 0;
  const settled = settledLength(text, from);
  for (const node of stream.live ?? []) node.remove();
  if (settled > from) stream.bubble.append(renderMarkdown(text.slice(from, settled)));
  const live = renderMarkdown(text.slice(settled));
  stream.live = Array.from(live.childNodes);
  stream.bubble.append(live);
  stream.settled = settled;
}

/** At most one drawing of the thread per frame the screen shows: a reply streaming in many
 * pieces a frame (a fast model, a page catching up) is drawn once per frame. */
let drawQueued = false;
function drawSoon() {
  if (drawQueued) return;
  drawQueued = true;
  requestAnimationFrame(() => {
    drawQueued = false;
    renderThread();
  });
}

function scrollToNewest() {
  if (view.t && view.hi !== Infinity) {
    setWindow(...newestWindow());
    renderEarlier(view.t);
    renderTail(view.t);
  }
  ui.messages.scrollTo({ top: ui.messages.scrollHeight });
  view.pinned = true;
  ui.newer.hidden = true;
}

/** The reader scrolled near the top of the window: the PAGE messages before it, drawn from
 * what this page holds, or asked for (`before_seq`) when it holds none older. */
function showEarlier() {
  const t = view.t;
  if (!t || view.lo === null) return;
  const first = lowerBound(t.order, view.lo);
  if (first === 0) {
    if (t.earlier) loadEarlier();
    return;
  }
  const from = Math.max(0, first - PAGE);
  const lo = t.order[from];
  const end = upTo(t.order, view.hi);
  const hi = end - from > MAX_SHOWN ? t.order[from + MAX_SHOWN - 1] : view.hi;
  keepingPlace(() => setWindow(lo, hi));
  renderEarlier(t);
  renderTail(t);
}

/** The reader scrolled near the bottom of a window that ends before the newest message: the
 * PAGE messages after it; the oldest of the window go past MAX_SHOWN. */
function showLater() {
  const t = view.t;
  if (!t || view.hi === Infinity) return;
  const end = Math.min(t.order.length, upTo(t.order, view.hi) + PAGE);
  const hi = end >= t.order.length ? Infinity : t.order[end - 1];
  const lo = Math.max(view.lo, t.order[Math.max(0, end - MAX_SHOWN)]);
  keepingPlace(() => {
    setWindow(lo, hi);
    renderEarlier(t);
    renderTail(t);
  });
}

function onScroll() {
  const box = ui.messages;
  const below = box.scrollHeight - box.scrollTop - box.clientHeight;
  view.pinned = below < NEAR_BOTTOM_PX && view.hi === Infinity;
  if (view.pinned) ui.newer.hidden = true;
  // Scrolled (by the reader: a thread too short to scroll never gets here) near an end.
  const t = view.t;
  if (!t || box.scrollHeight <= box.clientHeight) return;
  if (box.scrollTop < EARLIER_WITHIN_PX && !t.loadingEarlier && hasEarlier(t)) showEarlier();
  else if (below < EARLIER_WITHIN_PX && view.hi !== Infinity) showLater();
}

function renderComposerState() {
  ui.newConversation.disabled = !state.ready;
  if (state.active) renderThread();
}

function setStatus(kind, text) {
  if (kind !== "offline" || state.reconnectTimer === null) stopCountdown();
  ui.status.dataset.state = kind;
  ui.statusText.textContent = text;
}

/** Tell a screen reader something new: a reply that came, the assistant typing. Only this
 * region is live: the messages' log also gains what is not new (history, the messages the reader
 * scrolls back to), which would be read out by the hundred. The last few stay, so that two that
 * come together are both read. */
function announce(text) {
  const line = document.createElement("p");
  line.textContent = text;
  ui.announcer.append(line);
  while (ui.announcer.childElementCount > 3) ui.announcer.firstElementChild.remove();
}

/** What of a reply is read out unasked: its first ANNOUNCE_MAX characters, then "…" (on a
 * word's end where there is one near). The whole of it is in the conversation, to read on. */
function brief(text) {
  const flat = String(text).replace(/\s+/g, " ").trim();
  if (flat.length <= ANNOUNCE_MAX) return flat;
  let cut = flat.slice(0, ANNOUNCE_MAX);
  if (/[\uD800-\uDBFF]$/.test(cut)) cut = cut.slice(0, -1); // not half an emoji
  const space = cut.lastIndexOf(" ");
  if (space > ANNOUNCE_MAX * 0.75) cut = cut.slice(0, space);
  return `${cut.trimEnd()}…`;
}

let toastTimer = null;
function notify(text) {
  ui.toast.textContent = text;
  ui.toast.hidden = false;
  clearTimeout(toastTimer);
  toastTimer = setTimeout(() => {
    ui.toast.hidden = true;
  }, 6000);
}

function showFatal(title, text) {
  ui.fatalTitle.textContent = title;
  ui.fatalText.textContent = text;
  ui.fatal.hidden = false;
  setStatus("offline", "Not connected");
}

// One formatter each, made once: `toLocaleTimeString` builds one per call (about 0.1 ms), which
// took seconds for a long thread's history and again for a long conversation list per frame.
const TIME = new Intl.DateTimeFormat([], { hour: "2-digit", minute: "2-digit" });
const DAY = new Intl.DateTimeFormat([], { month: "short", day: "numeric" });

function formatTime(iso) {
  const date = iso ? new Date(iso) : null;
  return date && !Number.isNaN(date.getTime()) ? TIME.format(date) : "";
}

function formatDate(iso) {
  const date = new Date(iso);
  if (Number.isNaN(date.getTime())) return "";
  const today = new Date();
  return date.toDateString() === today.toDateString() ? TIME.format(date) : DAY.format(date);
}

// A phone or a tablet (touch as its main pointer) has no Shift key to hand, and its user types
// messages of several lines too: there Enter starts a new line and the Send button sends, as in
// the chat apps of phones. With a mouse and a keyboard, Enter sends and Shift+Enter is a new line.
const touchTyping = window.matchMedia("(pointer: coarse)");
function enterSends() {
  return !touchTyping.matches;
}
function renderEnterMode() {
  ui.input.enterKeyHint = enterSends() ? "send" : "enter";
  ui.hint.textContent = enterSends()
    ? "Enter to send · Shift+Enter for a new line"
    : "Enter for a new line · the Send button sends";
}

/** The size of the `send` frame `text` makes, in UTF-8 bytes, and whether it is over the
 * server's limit. */
function sendSize(text) {
  const frame = { type: "send", thread_id: state.active ?? "", client_id: randomId(), text };
  return new TextEncoder().encode(JSON.stringify(frame)).length;
}

function tooLongText(size) {
  const limit = state.limits.max_frame_bytes;
  return (
    `Too long to send: shorten it by about ${(size - limit).toLocaleString()} characters ` +
    `(the limit is ${limit.toLocaleString()} bytes; accented letters and emoji count as 2–4).`
  );
}

/** Say so under the box as soon as what is typed is too long to send, not only once Send is
 * pressed; the text stays as it is. */
function checkLength() {
  const text = ui.input.value;
  // Each character is at most 6 bytes in JSON (`\u001f`): short enough never needs counting.
  const size = text.length * 6 + 200 < state.limits.max_frame_bytes ? 0 : sendSize(text);
  const over = size > state.limits.max_frame_bytes;
  if (over) ui.tooLong.textContent = tooLongText(size);
  if (over !== !ui.tooLong.hidden) {
    ui.tooLong.hidden = !over;
    if (over) ui.input.setAttribute("aria-invalid", "true");
    else ui.input.removeAttribute("aria-invalid");
  }
}

function autosize() {
  ui.input.style.height = "auto";
  ui.input.style.height = `${Math.min(ui.input.scrollHeight, 200)}px`;
  endInSight(); // the height set again scrolled the box back from the line being written
}

/** A box being typed in at its end (as a message is written) keeps that end in sight. */
function endInSight() {
  const box = ui.input;
  if (document.activeElement === box && box.selectionEnd === box.value.length) {
    box.scrollTop = box.scrollHeight;
  }
}

function openSidebar() {
  ui.app.dataset.sidebar = "open";
  ui.scrim.hidden = false;
  ui.openSidebar.setAttribute("aria-expanded", "true");
  ui.main.inert = true; // the drawer covers the chat: keyboard and screen reader stay in it
  ui.newConversation.focus();
}

function closeSidebar({ restoreFocus = false } = {}) {
  if (ui.app.dataset.sidebar !== "open") return;
  ui.app.dataset.sidebar = "closed";
  ui.scrim.hidden = true;
  ui.openSidebar.setAttribute("aria-expanded", "false");
  ui.main.inert = false;
  if (restoreFocus) ui.openSidebar.focus();
}

// ---- wiring ---------------------------------------------------------------------------------

ui.composer.addEventListener("submit", (event) => {
  event.preventDefault();
  submit();
  // Sent with the button: back to the box, so a phone's keyboard stays up for the next one.
  ui.input.focus();
});
ui.input.addEventListener("keydown", (event) => {
  if (event.key !== "Enter" || event.isComposing) return;
  // Ctrl+Enter (Cmd+Enter) sends everywhere: a tablet with a keyboard case has one too.
  if (event.ctrlKey || event.metaKey || (enterSends() && !event.shiftKey)) {
    event.preventDefault();
    submit();
  }
});
ui.input.addEventListener("input", () => {
  saveDraft();
  autosize();
  checkLength();
});
ui.retry.addEventListener("click", () => {
  connect();
  ui.input.focus(); // the button is gone: the keyboard goes back to the message box
});
touchTyping.addEventListener("change", renderEnterMode);
renderEnterMode();
ui.newConversation.addEventListener("click", startConversation);
ui.earlier.addEventListener("click", showEarlier);
ui.messages.addEventListener("scroll", onScroll, { passive: true });
document.addEventListener("selectionchange", onSelectionChange);
const keepPinned = new ResizeObserver(() => {
  if (view.pinned) ui.messages.scrollTop = ui.messages.scrollHeight;
});
keepPinned.observe(ui.log);
keepPinned.observe(ui.messages);
// The box shrinks with the screen (a phone's keyboard coming up): the line being written stays.
new ResizeObserver(endInSight).observe(ui.input);
ui.newer.addEventListener("click", scrollToNewest);
ui.openSidebar.addEventListener("click", openSidebar);
ui.closeSidebar.addEventListener("click", () => closeSidebar({ restoreFocus: true }));
ui.scrim.addEventListener("click", () => closeSidebar({ restoreFocus: true }));
document.addEventListener("keydown", (event) => {
  if (event.key === "Escape") closeSidebar({ restoreFocus: true });
});
// The drawer only exists on narrow screens: one left open when the window widens (a rotated
// tablet) would leave the chat inert.
window.matchMedia("(max-width: 760px)").addEventListener("change", (event) => {
  if (!event.matches) closeSidebar();
});
window.addEventListener("offline", () => {
  if (state.ws) dropConnection(state.ws);
  else scheduleReconnect();
});
window.addEventListener("online", () => {
  if (!state.ws && ui.fatal.hidden) {
    state.attempt = 0;
    connect();
  }
});

// What was typed here before a reload (or a crash), there at once, before the socket opens.
state.boxThread = state.active;
ui.input.value = (state.active && loadDraft(state.active)) || "";
autosize();
renderComposerState();
connect();
