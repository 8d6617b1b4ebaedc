// idem console: refresh the overview's live part in place, every few
// seconds, without reloading the page (the only script the console has).
"use strict";
(function () {
  function start() {
    var live = document.getElementById("live");
    if (!live || !window.fetch) return;
    var url = live.getAttribute("data-refresh");
    var every = parseInt(live.getAttribute("data-every"), 10) || 3000;
    function refresh() {
      fetch(url, { credentials: "same-origin", cache: "no-store" })
        .then(function (r) {
          if (!r.ok) throw new Error("HTTP " + r.status);
          return r.text();
        })
        .then(function (html) {
          live.innerHTML = html;
          live.removeAttribute("data-stale");
        })
        .catch(function () {
          live.setAttribute("data-stale", "true");
        })
        .then(function () {
          setTimeout(refresh, every);
        });
    }
    setTimeout(refresh, every);
  }
  if (document.readyState === "loading") {
    document.addEventListener("DOMContentLoaded", start);
  } else {
    start();
  }
})();
