// Conclave's page, live: follows the event log by server-sent events and refreshes the part of
// the page marked `#live` from this same server. It only reads. Text from the log is set with
// textContent; refreshed parts are HTML the server escaped, under a policy that runs no inline
// script, so nothing a model or a fetched page wrote can run here.
"use strict";

(function () {
  const live = document.getElementById("live");
  if (!live || !live.dataset.events || !window.EventSource) {
    return;
  }
  let timer = null;

  function refresh() {
    timer = null;
    fetch(live.dataset.fragment, { credentials: "same-origin", headers: { Accept: "text/html" } })
      .then((response) => (response.ok ? response.text() : Promise.reject(response.status)))
      .then((html) => {
        live.innerHTML = html;
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

  const source = new EventSource(live.dataset.events);
  source.addEventListener("log", (message) => {
    append(JSON.parse(message.data).line);
    refreshSoon();
  });
  source.addEventListener("end", () => {
    source.close(); // the session ended: its transcript now holds the whole deliberation
    live.dataset.ended = "true";
    refresh();
  });
})();
