// weir status page: swaps in freshly rendered charts every sampling
// interval. The charts are SVG rendered by weir; this script only polls.
"use strict";
(function () {
  const body = document.body;
  const poll = Math.max(1000, parseInt(body.dataset.poll, 10) || 1000);
  const live = document.getElementById("live");
  let updates = 0;
  async function refresh() {
    try {
      const r = await fetch("/ui/charts", { credentials: "same-origin", cache: "no-store" });
      if (!r.ok) throw new Error(r.status + " " + r.statusText);
      const html = await r.text();
      const main = document.querySelector("main");
      main.innerHTML = html;
      updates++;
      body.dataset.updates = String(updates);
      live.textContent = "live: updated " + new Date().toLocaleTimeString();
      live.className = "live";
    } catch (e) {
      live.textContent = "stale: " + e.message;
      live.className = "live stale";
    }
  }
  refresh();
  setInterval(refresh, poll);
})();
