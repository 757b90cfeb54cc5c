// Live progress of an eval run (frontend/evals/run_detail.html): while the run is active, poll its JSON
// progress every 2 s and move the bar; once it stops (completed, failed, cancelled or paused) reload the
// page, which then shows the report or the pause reason. No polling once the run has ended.
(function () {
  "use strict";

  var ACTIVE = ["queued", "running"];
  var INTERVAL = 2000;

  function update(card, data) {
    var bar = card.querySelector("[data-progress-bar]");
    var fill = bar && bar.querySelector("span");
    if (fill) { fill.style.width = data.percent + "%"; }
    if (bar) { bar.setAttribute("aria-valuenow", String(data.finished)); bar.setAttribute("aria-valuemax", String(data.items)); }
    var text = card.querySelector("[data-progress-text]");
    if (text) {
      text.textContent = data.finished + " of " + data.items + " items finished" +
        (data.errored ? " (" + data.errored + " errored)" : "") +
        (ACTIVE.indexOf(data.status) >= 0 ? "; this page updates every 2 seconds." : ".");
    }
    var badge = card.querySelector("[data-progress-status]");
    if (badge) { badge.textContent = data.status_label; badge.className = "badge badge-run-" + data.status; }
    card.setAttribute("data-status", data.status);
  }

  function poll(card) {
    var url = card.getAttribute("data-progress-url");
    fetch(url, { headers: { Accept: "application/json" }, credentials: "same-origin" })
      .then(function (response) { return response.ok ? response.json() : null; })
      .then(function (data) {
        if (!data) { window.setTimeout(function () { poll(card); }, INTERVAL); return; }
        update(card, data);
        if (ACTIVE.indexOf(data.status) >= 0) {
          window.setTimeout(function () { poll(card); }, INTERVAL);
        } else {
          // Finished or paused: the page renders the report, the pause reason and the right buttons.
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
