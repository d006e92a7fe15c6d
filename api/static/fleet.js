// The fleet page refreshes its content in place: every data-refresh-seconds it fetches the
// fragment at data-refresh-url (same filters) and swaps it in. No inline script, no CDN (the
// dashboard's Content-Security-Policy allows scripts from 'self' only). A refresh is skipped while
// the user is typing in the filter form inside it, and when the tab is hidden.
(function () {
  "use strict";
  var live = document.getElementById("fleet-live");
  if (!live) { return; }
  var url = live.getAttribute("data-refresh-url");
  var seconds = parseFloat(live.getAttribute("data-refresh-seconds") || "15");
  var stamp = document.getElementById("refreshed-at");

  function busy() {
    var el = document.activeElement;
    return document.hidden || (el && live.contains(el) && /^(INPUT|SELECT|TEXTAREA)$/.test(el.tagName));
  }

  function refresh() {
    if (busy()) { return; }
    fetch(url, { credentials: "same-origin", headers: { "Accept": "text/html" } })
      .then(function (response) {
        if (!response.ok) { throw new Error("HTTP " + response.status); }
        return response.text();
      })
      .then(function (html) {
        live.innerHTML = html;
        var flag = live.querySelector("[data-source-unready]");
        var header = document.querySelector("header.top");
        if (flag && header) {
          header.classList.toggle("alarm", flag.getAttribute("data-source-unready") === "true");
        }
        live.removeAttribute("data-refresh-error");
        if (stamp) { stamp.textContent = new Date().toISOString().replace(/\.\d+Z$/, "Z"); }
      })
      .catch(function (err) { live.setAttribute("data-refresh-error", String(err)); });
  }

  window.setInterval(refresh, Math.max(2, seconds) * 1000);
})();
