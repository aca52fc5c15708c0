// The confirmation dialogs: focus moves into a dialog when it opens (the reason field, or
// the dialog itself), Escape closes it and gives focus back to the button that opened it.
// A dialog shown as a whole page (no htmx) closes by following its Back link.
(function () {
  "use strict";
  var opener = null;

  function openDialog() {
    return document.getElementById("dialog");
  }

  function focusDialog(dialog) {
    var target = dialog.querySelector("textarea, input:not([type=hidden]), select, button");
    var box = dialog.querySelector("[role=dialog]") || dialog;
    if (!box.hasAttribute("tabindex")) { box.setAttribute("tabindex", "-1"); }
    (target || box).focus();
  }

  document.addEventListener("click", function (event) {
    var link = event.target.closest && event.target.closest("[hx-target='#dialog-slot']");
    if (link) { opener = link; }
  });

  document.addEventListener("htmx:afterSettle", function () {
    var dialog = openDialog();
    if (dialog && !dialog.contains(document.activeElement)) { focusDialog(dialog); }
  });

  document.addEventListener("DOMContentLoaded", function () {
    var dialog = openDialog();
    if (dialog) { focusDialog(dialog); }
  });

  // A live list ([data-pause-on-dialog]) does not refresh while a dialog or one of its
  // payload disclosures is open: what the operator reads or confirms stays put.
  document.addEventListener("htmx:beforeRequest", function (event) {
    var elt = event.detail && event.detail.elt;
    if (!elt || !elt.hasAttribute || !elt.hasAttribute("data-pause-on-dialog")) { return; }
    if (openDialog() || elt.querySelector("details[open]")) { event.preventDefault(); }
  });

  document.addEventListener("keydown", function (event) {
    if (event.key !== "Escape") { return; }
    var dialog = openDialog();
    if (!dialog) { return; }
    event.preventDefault();
    var slot = dialog.closest("#dialog-slot");
    if (slot) {
      slot.innerHTML = "";
      if (opener && document.body.contains(opener)) { opener.focus(); }
      opener = null;
      return;
    }
    var back = dialog.querySelector(".dialog-buttons a.button");
    if (back) { window.location.assign(back.getAttribute("href")); }
  });
})();
