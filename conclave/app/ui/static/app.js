// Conclave's page, live: follows the event log by server-sent events and refreshes the part of
// the page marked `#live` from this same server. It only reads. Text from the log is set with
// textContent; refreshed parts are HTML the server escaped, under a policy that runs no inline
// script, so nothing a model or a fetched page wrote can run here.
//
// When the page is served by the process running the session (`serve --http`: the page carries
// `data-live`), it also follows the answers' text as it streams in (`/live`), a card per member
// and role in `#streaming`, text added as text nodes only; the session's end replaces it all.
"use strict";

(function () {
  const live = document.getElementById("live");
  if (!live || !live.dataset.events || !window.EventSource) {
    return;
  }
  let timer = null;

  // The streaming area: kept across refreshes (each one's placeholder is swapped for it), and
  // dropped when a refresh has none (the session ended: its whole deliberation replaces it).
  let streaming = document.getElementById("streaming");
  const cards = new Map();

  function keepStreaming() {
    const placeholder = document.getElementById("streaming");
    if (!placeholder) {
      streaming = null; // the session ended: what it said is on the page now, whole
    } else if (streaming && placeholder !== streaming) {
      placeholder.replaceWith(streaming);
    }
  }

  function refresh() {
    timer = null;
    fetch(live.dataset.fragment, { credentials: "same-origin", headers: { Accept: "text/html" } })
      .then((response) => (response.ok ? response.text() : Promise.reject(response.status)))
      .then((html) => {
        live.innerHTML = html;
        keepStreaming();
        live.dataset.refreshed = String(Number(live.dataset.refreshed || 0) + 1);
      })
      .catch(() => {}); // the next event tries again
  }

  function refreshSoon() {
    if (timer === null) {
      timer = setTimeout(refresh, 200); // a burst of events costs one request
    }
  }

  function append(line) {
    const list = document.getElementById("activity");
    if (list) {
      const item = document.createElement("li");
      item.textContent = line;
      list.appendChild(item);
    }
  }

  function cardFor(provider, role) {
    const key = JSON.stringify([provider, role]);
    let text = cards.get(key);
    if (!text) {
      const card = document.createElement("article");
      card.className = "card streaming";
      card.dataset.provider = provider;
      card.dataset.role = role || "";
      const head = document.createElement("header");
      const who = document.createElement("span");
      who.className = "provider";
      who.textContent = provider;
      head.appendChild(who);
      if (role) {
        const badge = document.createElement("span");
        badge.className = "badge";
        badge.textContent = role;
        head.appendChild(badge);
      }
      const body = document.createElement("div");
      body.className = "text";
      text = document.createTextNode("");
      body.appendChild(text);
      card.append(head, body);
      streaming.querySelector(".columns").appendChild(card);
      cards.set(key, text);
    }
    return text;
  }

  function gap(dropped) {
    const note = document.createElement("p");
    note.className = "muted gap";
    note.textContent = `(the page fell behind: ${dropped} pieces of the answers were skipped here; the final answers will be whole)`;
    streaming.appendChild(note);
  }

  let heard = null;
  if (live.dataset.live && streaming) {
    heard = new EventSource(live.dataset.live);
    heard.addEventListener("delta", (message) => {
      const delta = JSON.parse(message.data);
      if (streaming && delta.kind === "start") {
        // A new model call of this member (a tool hop, a re-prompt): its text replaces the last.
        cardFor(String(delta.provider), delta.role ? String(delta.role) : "").data = "";
      } else if (streaming && delta.kind === "text" && typeof delta.text === "string") {
        cardFor(String(delta.provider), delta.role ? String(delta.role) : "").appendData(delta.text);
        streaming.hidden = false;
      }
    });
    heard.addEventListener("gap", (message) => {
      if (streaming) {
        gap(Number(JSON.parse(message.data).dropped));
      }
    });
    heard.addEventListener("end", () => heard.close()); // the session ended (or runs elsewhere)
  }

  const source = new EventSource(live.dataset.events);
  source.addEventListener("log", (message) => {
    append(JSON.parse(message.data).line);
    refreshSoon();
  });
  source.addEventListener("end", () => {
    source.close(); // the session ended: its transcript now holds the whole deliberation
    if (heard) {
      heard.close();
    }
    live.dataset.ended = "true";
    refresh();
  });
})();
