// The instance page's live stream lists: each open stream's new entries through an
// EventSource (the browser resumes from the last id after a reconnect). Text only.
(function () {
  document.querySelectorAll(".selvedge-live-stream").forEach(function (box) {
    if (!window.EventSource) return;
    const list = box.querySelector("ol");
    const state = box.querySelector(".selvedge-live-state");
    const source = new EventSource(box.dataset.url);
    source.onopen = function () { state.textContent = "(live)"; };
    source.onmessage = function (event) {
      const entry = JSON.parse(event.data);
      const item = document.createElement("li");
      item.dataset.seq = String(entry.seq);
      const who = entry.attempt === null ? "workflow" : "attempt " + entry.attempt;
      item.textContent = JSON.stringify(entry.value) + " (" + who + ")";
      list.appendChild(item);
    };
    source.addEventListener("end", function () {
      state.textContent = "(closed)";
      source.close();
    });
    source.onerror = function () {
      if (source.readyState !== EventSource.CLOSED) state.textContent = "(reconnecting)";
    };
  });
})();
