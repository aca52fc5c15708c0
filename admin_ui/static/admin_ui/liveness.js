/* Tenure dashboard: say at once when the live view is stale.
 *
 * The overview's blocks poll the server with htmx. When a poll fails (no answer, a network
 * error, a timeout or a non-2xx answer), the page shows a banner saying since when it was not
 * updated and greys out every polled block; the next poll that succeeds clears both.
 * Loaded as a static file: the dashboard's Content-Security-Policy allows no inline script.
 */
(function () {
  "use strict";
  var lastOk = new Date();
  var ticking = null;

  function pad(n) { return (n < 10 ? "0" : "") + n; }
  function hms(d) {
    return pad(d.getUTCHours()) + ":" + pad(d.getUTCMinutes()) + ":" + pad(d.getUTCSeconds());
  }
  function banner() { return document.getElementById("stale-banner"); }
  // The element that sent the request: after an outerHTML swap the event's own element may
  // be another one (the old element is no longer in the page).
  function polled(detail) {
    var elt = detail && ((detail.requestConfig && detail.requestConfig.elt) || detail.elt);
    return elt && elt.closest && elt.closest("[data-poll]");
  }

  function render() {
    var b = banner();
    if (!b) { return; }
    var ago = Math.max(0, Math.round((Date.now() - lastOk.getTime()) / 1000));
    var text = b.querySelector("[data-stale-text]");
    text.textContent = "Not updated since " + hms(lastOk) + " UTC (" + ago +
      " s ago): the dashboard cannot reach the server.";
    b.setAttribute("data-since", lastOk.toISOString());
  }

  function markStale() {
    var b = banner();
    if (b) { b.hidden = false; }
    document.querySelectorAll("[data-poll]").forEach(function (el) {
      el.classList.add("stale");
      el.setAttribute("aria-busy", "true");
    });
    render();
    if (ticking === null) { ticking = window.setInterval(render, 1000); }
  }

  function markFresh() {
    lastOk = new Date();
    var b = banner();
    if (b) { b.hidden = true; }
    document.querySelectorAll("[data-poll].stale").forEach(function (el) {
      el.classList.remove("stale");
      el.removeAttribute("aria-busy");
    });
    if (ticking !== null) { window.clearInterval(ticking); ticking = null; }
  }

  if (window.htmx && !window.htmx.config.timeout) {
    // A server that accepts the connection and never answers is as stale as one that is gone.
    window.htmx.config.timeout = 10000;
  }
  ["htmx:sendError", "htmx:responseError", "htmx:timeout"].forEach(function (name) {
    document.body.addEventListener(name, function (e) {
      if (polled(e.detail)) { markStale(); }
    });
  });
  document.body.addEventListener("htmx:afterRequest", function (e) {
    if (!polled(e.detail)) { return; }
    if (e.detail.successful) { markFresh(); } else { markStale(); }
  });
})();
