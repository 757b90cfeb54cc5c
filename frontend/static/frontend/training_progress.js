// Live progress of an export (frontend/training/export_detail.html): while it is queued or running, poll
// its JSON progress every 2 s and move the bar; once it stops (succeeded, failed or cancelled) reload the
// page, which then shows the download link and the manifest, or the error. No polling once it has ended.
(function () {
  "use strict";

  var ACTIVE = ["queued", "running"];
  var INTERVAL = 2000;

  function update(card, data) {
    var bar = card.querySelector("[data-progress-bar]");
    var fill = bar && bar.querySelector("span");
    if (fill) { fill.style.width = data.percent + "%"; }
    if (bar) { bar.setAttribute("aria-valuenow", String(data.groups_done)); bar.setAttribute("aria-valuemax", String(data.groups_total)); }
    var text = card.querySelector("[data-progress-text]");
    if (text) {
      text.textContent = data.groups_done + " of " + data.groups_total + " groups written" +
        (ACTIVE.indexOf(data.status) >= 0 ? "; this page updates every 2 seconds." : ".");
    }
    var badge = card.querySelector("[data-progress-status]");
    if (badge) { badge.textContent = data.status_label; badge.className = "badge badge-run-" + data.status; }
    card.setAttribute("data-status", data.status);
  }

  function poll(card) {
    fetch(card.getAttribute("data-progress-url"), { headers: { Accept: "application/json" }, credentials: "same-origin" })
      .then(function (response) { return response.ok ? response.json() : null; })
      .then(function (data) {
        if (!data) { window.setTimeout(function () { poll(card); }, INTERVAL); return; }
        update(card, data);
        if (ACTIVE.indexOf(data.status) >= 0) {
          window.setTimeout(function () { poll(card); }, INTERVAL);
        } else {
          window.location.reload();
        }
      })
      .catch(function () { window.setTimeout(function () { poll(card); }, INTERVAL); });
  }

  document.addEventListener("DOMContentLoaded", function () {
    var card = document.querySelector("[data-progress-url]");
    if (card) { window.setTimeout(function () { poll(card); }, INTERVAL); }
  });
})();
