// The order's steps as they happen: the workflow's "steps" stream through an EventSource.
// The browser reconnects by itself (after a dropped connection, or when the server ends a
// response) and sends the last id it saw, so the server resumes after that entry.
(function () {
  const box = document.getElementById("live-steps");
  if (!box || !window.EventSource) return;
  const list = document.getElementById("stream");
  const state = document.getElementById("stream-state");
  const shownAttempt = {}; // activity id -> the newest attempt seen
  const source = new EventSource(box.dataset.url);
  source.onopen = function () {
    state.textContent = "live";
  };
  source.onmessage = function (event) {
    const entry = JSON.parse(event.data);
    const value = entry.value || {};
    const item = document.createElement("li");
    item.dataset.seq = String(entry.seq);
    let text = value.step || value.note || JSON.stringify(value);
    if (entry.attempt !== null) {
      // Written by an activity attempt: a retry's notes follow the failed attempt's,
      // which are marked as such rather than removed.
      const owner = entry.activity_id || "";
      item.dataset.activity = owner;
      item.dataset.attempt = String(entry.attempt);
      text += " (attempt " + entry.attempt + ")";
      if (entry.attempt > (shownAttempt[owner] || 0)) {
        list.querySelectorAll("li[data-activity]").forEach(function (old) {
          if (old.dataset.activity === owner) old.classList.add("retried");
        });
        shownAttempt[owner] = entry.attempt;
      }
    }
    item.textContent = text;
    list.appendChild(item);
  };
  source.addEventListener("end", function () {
    state.textContent = "finished";
    source.close();
  });
  source.onerror = function () {
    if (source.readyState !== EventSource.CLOSED) state.textContent = "reconnecting";
  };
})();
