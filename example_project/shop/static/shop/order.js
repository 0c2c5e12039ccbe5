// Live progress: fetch the server-rendered (escaped) part of this page again
// while the workflow runs; skip a round while someone is typing in it.
(function () {
  const box = document.getElementById("progress");
  async function refresh() {
    const live = box.querySelector(".live");
    if (!live || live.dataset.running !== "true") return;
    const active = document.activeElement;
    if (!(active && box.contains(active) && active.tagName === "INPUT")) {
      try {
        const response = await fetch(box.dataset.url, { credentials: "same-origin" });
        if (response.ok) box.innerHTML = await response.text();
      } catch (error) {
        // The next round tries again.
      }
    }
    setTimeout(refresh, 1000);
  }
  setTimeout(refresh, 1000);
})();
