// A training job's metric charts (frontend/training/job_detail.html): loss, reward (the recorded mean and
// the policy-weighted reward), validation score and KL per step, from the page's json_script. While the
// job is queued or running, poll its metrics every 5 s, redraw, and raise the reward-hacking flag when the
// server sets it; once the job stops, reload for the adapter, model target and comparison run.
// uPlot is served from frontend/node_modules (no CDN).
(function () {
  "use strict";

  var COLORS = ["#4f46e5", "#d97706", "#059669", "#0891b2"];
  var ACTIVE = ["queued", "running"];
  var INTERVAL = 5000;
  var plots = [];

  function columns(chart, data) {
    var out = [data.steps];
    chart.keys.forEach(function (key) { out.push(data.series[key] || data.steps.map(function () { return null; })); });
    return out;
  }

  function reported(chart, data) {
    return chart.keys.some(function (key) {
      return (data.series[key] || []).some(function (value) { return value != null; });
    });
  }

  function draw(data) {
    if (typeof window.uPlot === "undefined") { return; }
    document.querySelectorAll("[data-training-chart]").forEach(function (element) {
      var index = parseInt(element.getAttribute("data-training-chart"), 10);
      var chart = data.charts[index];
      var series = [{ label: "Step" }];
      chart.keys.forEach(function (key, position) {
        series.push({
          label: key,
          stroke: COLORS[position % COLORS.length],
          width: 2,
          spanGaps: true,  // the validation score is measured every few steps
          points: { show: true, size: 5 },
          value: function (plot, value) { return value == null ? "—" : value.toFixed(4); }
        });
      });
      var plot = new window.uPlot({
        width: Math.max(element.clientWidth, 280),
        height: 220,
        series: series,
        scales: { x: { time: false } },
        axes: [{ label: "step" }, { size: 56 }],
        legend: { live: true }
      }, columns(chart, data), element);
      plots[index] = plot;
      element.setAttribute("data-drawn", "true");
      element.setAttribute("data-points", String(data.steps.length));
      window.addEventListener("resize", function () { plot.setSize({ width: Math.max(element.clientWidth, 280), height: 220 }); });
    });
  }

  function update(data, charts) {
    var merged = { charts: charts, steps: data.metrics.steps, series: data.metrics.series };
    plots.forEach(function (plot, index) {
      if (!plot) { return; }
      plot.setData(columns(charts[index], merged));
      var element = document.querySelector('[data-training-chart="' + index + '"]');
      element.setAttribute("data-points", String(merged.steps.length));
      var empty = element.parentNode.querySelector("[data-no-points]");
      if (empty) { empty.hidden = reported(charts[index], merged); }
    });
    document.querySelectorAll("#latest-metrics tr[data-metric]").forEach(function (row) {
      var values = merged.series[row.getAttribute("data-metric")] || [];
      for (var i = values.length - 1; i >= 0; i--) {
        if (values[i] != null) { row.querySelector("td").textContent = values[i].toFixed(4); break; }
      }
    });
    var flag = document.getElementById("reward-hacking");
    if (flag && data.flagged) {
      flag.querySelector("[data-flag-reason]").textContent = data.flag_reason;
      flag.hidden = false;
    }
    var card = document.getElementById("job-state");
    var badge = card.querySelector("[data-state-status]");
    if (badge) { badge.textContent = data.status_label; badge.className = "badge badge-run-" + data.status; }
    var text = card.querySelector("[data-state-text]");
    if (text) {
      text.textContent = "Step " + data.steps_done + (data.steps ? " of " + data.steps : "") +
        (ACTIVE.indexOf(data.status) >= 0 ? "; this page updates every 5 seconds." : ".");
    }
    var bar = card.querySelector("[data-state-bar]");
    if (bar && data.steps) {
      bar.setAttribute("aria-valuenow", String(data.steps_done));
      bar.querySelector("span").style.width = Math.min(100, 100 * data.steps_done / data.steps) + "%";
    }
    card.setAttribute("data-status", data.status);
  }

  function poll(card, charts) {
    fetch(card.getAttribute("data-metrics-url"), { headers: { Accept: "application/json" }, credentials: "same-origin" })
      .then(function (response) { return response.ok ? response.json() : null; })
      .then(function (data) {
        if (data) { update(data, charts); }
        if (!data || ACTIVE.indexOf(data.status) >= 0) {
          window.setTimeout(function () { poll(card, charts); }, INTERVAL);
        } else {
          window.location.reload();
        }
      })
      .catch(function () { window.setTimeout(function () { poll(card, charts); }, INTERVAL); });
  }

  document.addEventListener("DOMContentLoaded", function () {
    var source = document.getElementById("training-chart-data");
    if (!source) { return; }
    var data = JSON.parse(source.textContent);
    draw(data);
    var card = document.querySelector("[data-metrics-url]");
    if (card) { window.setTimeout(function () { poll(card, data.charts); }, INTERVAL); }
  });
})();
