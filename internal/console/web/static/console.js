// Podium console: live pages. The only script of the console, loaded from 'self' (no inline
// script: the CSP forbids it). A page whose <main> names a live stream (data-live) listens to
// it; on each "update" it fetches itself again and swaps in the new <main>, at most one fetch
// at a time with one more queued. The swapped nodes come from the server's escaped HTML,
// parsed by DOMParser; scripts in parsed HTML never run.
(function () {
  "use strict";
  var main = document.querySelector("main[data-live]");
  var state = document.getElementById("live-state");
  if (!main || !window.EventSource) return;
  var busy = false, again = false, updates = 0;

  function refresh() {
    if (busy) { again = true; return; }
    busy = true;
    fetch(location.href, { credentials: "same-origin", cache: "no-store" })
      .then(function (r) { return r.ok ? r.text() : null; })
      .then(function (html) {
        if (html === null) return;
        var next = new DOMParser().parseFromString(html, "text/html").querySelector("main[data-live]");
        if (!next) return;
        var open = Array.prototype.map.call(main.querySelectorAll("details[open]"), function (d) { return d.closest("section") && d.closest("section").id; });
        main.replaceChildren.apply(main, Array.prototype.map.call(next.childNodes, function (n) { return document.importNode(n, true); }));
        open.forEach(function (id) { var d = id && document.querySelector("#" + id + " details"); if (d) d.open = true; });
        updates++;
        document.body.setAttribute("data-updates", String(updates));
      })
      .catch(function () {})
      .then(function () {
        busy = false;
        if (again) { again = false; refresh(); }
      });
  }

  var source = new EventSource(main.getAttribute("data-live"));
  source.addEventListener("open", function () {
    if (state) state.className = "live-state on";
    document.body.setAttribute("data-live-open", "1");
  });
  source.addEventListener("error", function () { if (state) state.className = "live-state"; });
  source.addEventListener("update", refresh);
})();
