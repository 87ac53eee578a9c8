// pgkb's search page: sign in with a token (kept in sessionStorage), search, read answers with citations.
// Plain JavaScript, no dependencies; every text from the server is inserted with textContent, never as HTML,
// except answer_html / content_html: Markdown the server rendered with raw HTML off and links limited to
// http(s) and kb:// (pgkb.web.markdown).
"use strict";

const TOKEN_KEY = "pgkb-token";
const $ = (id) => document.getElementById(id);
let askSupported = true; // false once /api/ask answered 501 (the database has no kb.ask yet)
let searchSerial = 0; // answers of an older search are dropped
let shownAnswer = null; // {question_id, question, kb} of the answer on screen, for its rating

function el(tag, attrs, ...children) {
  const node = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs || {})) {
    if (k === "class") node.className = v;
    else node.setAttribute(k, v);
  }
  for (const child of children) {
    if (child !== null && child !== undefined) node.append(child instanceof Node ? child : String(child));
  }
  return node;
}

class ApiError extends Error {
  constructor(status, message) {
    super(message);
    this.status = status;
  }
}

async function api(method, path, body) {
  const headers = { Authorization: "Bearer " + (sessionStorage.getItem(TOKEN_KEY) || "") };
  const init = { method, headers };
  if (body !== undefined) {
    headers["Content-Type"] = "application/json";
    init.body = JSON.stringify(body);
  }
  let response;
  try {
    response = await fetch(path, init);
  } catch (e) {
    throw new ApiError(0, "the server cannot be reached");
  }
  let payload = null;
  try {
    payload = await response.json();
  } catch (e) {
    payload = null;
  }
  if (!response.ok) {
    throw new ApiError(response.status, (payload && payload.error) || "HTTP " + response.status);
  }
  return payload;
}

function setStatus(text, isError) {
  $("status").textContent = text || "";
  $("status").classList.toggle("error", Boolean(isError));
}

function isWebLink(url) {
  try {
    const parsed = new URL(url);
    return parsed.protocol === "http:" || parsed.protocol === "https:";
  } catch (e) {
    return false;
  }
}

function crumbs(title, headingPath) {
  const node = el("div", { class: "crumbs" });
  [title, ...(headingPath || [])].forEach((part, i) => {
    if (i > 0) node.append(el("span", { class: "sep" }, "›"));
    node.append(el("span", {}, part));
  });
  return node;
}

// "also in kb://…": the other documents holding the same text (the server shows one copy).
function alsoIn(item) {
  return item.also_in && item.also_in.length ? el("div", { class: "also-in" }, "also in " + item.also_in.join(", ")) : null;
}

// A source: a link for http(s) sources; documents without one open in the side panel.
function sourceControl(item, label) {
  if (isWebLink(item.source_url || item.source)) {
    const url = item.source_url || item.source;
    return el("a", { href: url, target: "_blank", rel: "noopener noreferrer", class: "source" }, label || url);
  }
  const button = el("button", { type: "button", class: "link source" }, label || item.uri || item.source);
  button.addEventListener("click", () => openDocument(item.kb, item.doc_id || item.doc_key, item.chunk_index));
  return button;
}

// ------------------------------------------------------------------------------------------ sign-in

async function signIn(token) {
  sessionStorage.setItem(TOKEN_KEY, token);
  try {
    const data = await api("GET", "/api/kbs");
    showApp(data);
    return true;
  } catch (e) {
    sessionStorage.removeItem(TOKEN_KEY);
    $("signin-error").textContent = e.status === 401 ? "This token is not valid." : "Cannot sign in: " + e.message;
    $("signin-error").hidden = false;
    return false;
  }
}

function signOut() {
  sessionStorage.removeItem(TOKEN_KEY);
  $("app").hidden = true;
  $("who").hidden = true;
  $("doc-view").hidden = true;
  $("signin").hidden = false;
  $("results").replaceChildren();
  $("answer").hidden = true;
  $("gaps").hidden = true;
  $("gaps-list").replaceChildren();
  setStatus("");
}

function showApp(data) {
  $("signin").hidden = true;
  $("signin-error").hidden = true;
  $("app").hidden = false;
  $("who").hidden = false;
  $("who-name").textContent = "Signed in as " + data.user;
  const picker = $("kb");
  picker.replaceChildren(el("option", { value: "" }, "All knowledge bases"));
  for (const kb of data.knowledge_bases) {
    const details = [kb.document_count + " documents", kb.language].filter(Boolean).join(", ");
    const option = el("option", { value: kb.name }, kb.name + " (" + details + ")");
    option.dataset.language = kb.language || "";
    picker.append(option);
  }
  picker.dataset.language = data.language || "";
  showLanguage();
  // what was asked and not found: for the knowledge bases the user owns (or all, for an administrator)
  const managed = data.knowledge_bases.filter((kb) => kb.can_manage);
  $("gaps-kb").replaceChildren(...managed.map((kb) => el("option", { value: kb.name }, kb.name)));
  $("gaps-list").replaceChildren();
  $("gaps-status").textContent = "";
  $("gaps").hidden = managed.length === 0;
  $("query").focus();
}

// The language of the chosen knowledge base(s): ask in it, or put a translation in "Also as" (without one the
// database translates the question's words with its dictionary).
function showLanguage() {
  const picker = $("kb");
  const language = picker.value ? picker.selectedOptions[0].dataset.language : picker.dataset.language;
  $("language").textContent = language
    ? "The knowledge is " + language + ". A question in another language finds more with its translation in “Also as”."
    : "";
}

// ------------------------------------------------------------------------------------------- search

function renderResults(data) {
  const list = $("results");
  list.replaceChildren();
  for (const hit of data.results) {
    const snippet = el("p", { class: "snippet" });
    for (const part of hit.snippet) snippet.append(part.hit ? el("mark", {}, part.text) : part.text);
    const meta = [hit.kb];
    if (hit.page !== null && hit.page !== undefined) meta.push("page " + hit.page);
    meta.push("score " + Number(hit.score).toFixed(3));
    const sources = el("div", { class: "sources" }, sourceControl(hit));
    if (isWebLink(hit.source)) {
      const inPage = el("button", { type: "button", class: "link" }, "show passage");
      inPage.addEventListener("click", () => openDocument(hit.kb, hit.doc_id, hit.chunk_index));
      sources.append(inPage);
    }
    list.append(el("li", { class: "result" }, crumbs(hit.title, hit.heading_path),
      el("div", { class: "meta" }, meta.join(" · ")), snippet, sources, alsoIn(hit)));
  }
  let status = data.results.length ? data.results.length + " results" : "Nothing found. Try other words or all knowledge bases.";
  if (data.degraded) status += " (keyword search only: " + data.degraded_reason + ")";
  setStatus(status, false);
}

function renderAnswer(data) {
  // the answer's Markdown as the server rendered it; its [n] markers link to the citations
  $("answer-text").innerHTML = data.answer_html || "";
  const list = $("citations");
  list.replaceChildren();
  for (const c of data.citations || []) {
    const label = [c.title || c.doc_key, ...(c.heading_path || [])].join(" › ") +
      (c.page !== null && c.page !== undefined ? " (page " + c.page + ")" : "");
    const item = el("li", { id: "citation-" + c.n, value: c.n }, sourceControl(c, label));
    if (c.quote) item.append(el("div", { class: "quote" }, "“" + c.quote + "”"));
    const also = alsoIn(c);
    if (also) item.append(also);
    list.append(item);
  }
  // what to know about the answer (extractive, lexical only, a failed chat endpoint ...)
  $("answer-notes").replaceChildren(...(data.notes || []).map((note) => el("li", {}, note)));
  resetFeedback();
  $("answer").hidden = false;
}

// ------------------------------------------------------------------------------------------ ratings

function resetFeedback() {
  $("rate-up").disabled = false;
  $("rate-down").disabled = false;
  $("rate-note").value = "";
  $("rate-status").textContent = "";
  $("rate-status").classList.remove("error");
}

// 👍 / 👎 on the answer shown: against its logged question, or kept alone with its text when the knowledge
// base keeps no question log.
async function rate(helpful) {
  if (!shownAnswer) return;
  const body = { helpful, note: $("rate-note").value.trim() };
  if (shownAnswer.question_id) body.question_id = shownAnswer.question_id;
  else Object.assign(body, { question: shownAnswer.question, kb: shownAnswer.kb || null });
  $("rate-up").disabled = true;
  $("rate-down").disabled = true;
  try {
    await api("POST", "/api/rate", body);
    $("rate-status").textContent = helpful ? "Thanks: marked helpful." : "Thanks: marked not helpful.";
  } catch (e) {
    $("rate-status").textContent = "Not recorded: " + e.message;
    $("rate-status").classList.add("error");
    $("rate-up").disabled = false;
    $("rate-down").disabled = false;
    if (e.status === 401) signOut();
  }
}

async function runAsk(serial, body) {
  try {
    const data = await api("POST", "/api/ask", { question: body.query, kb: body.kb, top_k: body.top_k, also: body.also });
    if (serial === searchSerial) {
      shownAnswer = { question_id: data.question_id, question: body.query, kb: body.kb };
      renderAnswer(data);
    }
  } catch (e) {
    if (e.status === 501) askSupported = false;
    if (serial === searchSerial) $("answer").hidden = true;
    if (e.status === 401) signOut();
  }
}

async function runSearch(event) {
  event.preventDefault();
  const also = $("also").value.trim();
  const body = { query: $("query").value, kb: $("kb").value, top_k: Number($("top-k").value), also: also ? [also] : [] };
  const serial = ++searchSerial;
  $("search-button").disabled = true;
  $("answer").hidden = true;
  shownAnswer = null;
  setStatus("Searching…");
  const asking = askSupported ? runAsk(serial, body) : null;
  try {
    // beside an ask, the question log keeps the ask alone (one question, not two)
    const data = await api("POST", "/api/search", { ...body, logged: !asking });
    if (serial === searchSerial) renderResults(data);
  } catch (e) {
    if (e.status === 401) signOut();
    else if (serial === searchSerial) setStatus(e.message, true);
  } finally {
    $("search-button").disabled = false;
  }
  await asking;
}

// ------------------------------------------------------------------------------------- knowledge gaps

async function showGaps(event) {
  event.preventDefault();
  const kb = $("gaps-kb").value;
  const list = $("gaps-list");
  list.replaceChildren();
  $("gaps-status").textContent = "Loading…";
  $("gaps-status").classList.remove("error");
  try {
    const data = await api("POST", "/api/gaps", { kb, since: $("gaps-since").value });
    for (const t of data.topics) {
      const counts = t.questions + (t.questions === 1 ? " question" : " questions") +
        (t.unhelpful ? " (" + t.unhelpful + " rated unhelpful)" : "") + " · last asked " + new Date(t.last_asked).toLocaleString();
      const examples = el("ul", { class: "examples" }, ...(t.examples || []).map((q) => el("li", {}, q)));
      const closest = (t.closest_documents || []).length
        ? el("div", { class: "closest" }, "closest documents: " + t.closest_documents.join(", "))
        : el("div", { class: "closest" }, "no document came close");
      list.append(el("li", { class: "gap" }, el("div", { class: "meta" }, counts), examples, closest));
    }
    let status = data.topics.length ? data.topics.length + " topics" : "Nothing asked and not found in this period.";
    if (data.question_log_days === null) status += " The question log of " + kb + " is off: nothing new is recorded.";
    $("gaps-status").textContent = status;
  } catch (e) {
    $("gaps-status").textContent = e.message;
    $("gaps-status").classList.add("error");
    if (e.status === 401) signOut();
  }
}

// ---------------------------------------------------------------------------------------- documents

async function openDocument(kb, docId, chunkIndex) {
  const panel = $("doc-view");
  $("doc-title").textContent = "Loading…";
  $("doc-source").textContent = "";
  $("doc-chunks").replaceChildren();
  panel.hidden = false;
  try {
    const doc = await api("POST", "/api/document", { kb, doc_id: docId, chunk_index: chunkIndex, window: 3 });
    $("doc-title").textContent = doc.title || doc.doc_id;
    const source = isWebLink(doc.source)
      ? el("a", { href: doc.source, target: "_blank", rel: "noopener noreferrer" }, doc.source)
      : doc.source;
    $("doc-source").replaceChildren(source, " · " + doc.chunk_count + " passages");
    let hitNode = null;
    for (const chunk of doc.chunks) {
      const content = el("div", { class: "content" });
      content.innerHTML = chunk.content_html; // the server's rendering of its Markdown
      const node = el("div", { class: "chunk" + (chunk.chunk_index === chunkIndex ? " hit" : "") },
        chunk.heading_path.length ? el("div", { class: "heading" }, chunk.heading_path.join(" › ")) : null,
        content);
      node.dataset.chunk = chunk.chunk_index;
      if (chunk.chunk_index === chunkIndex) hitNode = node;
      $("doc-chunks").append(node);
    }
    if (hitNode) hitNode.scrollIntoView({ block: "nearest" });
  } catch (e) {
    $("doc-title").textContent = "Cannot open the document";
    $("doc-source").textContent = e.message;
    if (e.status === 401) signOut();
  }
}

// ------------------------------------------------------------------------------------------- wiring

document.addEventListener("DOMContentLoaded", () => {
  $("signin-form").addEventListener("submit", (event) => {
    event.preventDefault();
    signIn($("token").value.trim()).then((ok) => { if (ok) $("token").value = ""; });
  });
  $("sign-out").addEventListener("click", signOut);
  $("search-form").addEventListener("submit", runSearch);
  $("kb").addEventListener("change", showLanguage);
  $("doc-close").addEventListener("click", () => { $("doc-view").hidden = true; });
  $("rate-up").addEventListener("click", () => rate(true));
  $("rate-down").addEventListener("click", () => rate(false));
  $("gaps-form").addEventListener("submit", showGaps);
  const saved = sessionStorage.getItem(TOKEN_KEY);
  if (saved) signIn(saved);
});
