// Signal-rate charts (frontend/triage/signals.html): one uPlot chart per signal, a line per prompt version.
// The data comes from the page (json_script); uPlot is served from frontend/node_modules (no CDN).
(function () {
  "use strict";

  var COLORS = ["#4f46e5", "#dc2626", "#059669", "#d97706", "#0891b2", "#7c3aed", "#db2777", "#65a30d"];

  function percent(value) { return value == null ? "—" : (value * 100).toFixed(1) + "%"; }

  function draw() {
    var source = document.getElementById("signal-chart-data");
    if (!source || typeof window.uPlot === "undefined") { return; }
    var data = JSON.parse(source.textContent);
    document.querySelectorAll("[data-signal-chart]").forEach(function (element) {
      var chart = data.charts[parseInt(element.getAttribute("data-signal-chart"), 10)];
      var width = Math.max(element.clientWidth, 280);
      var series = [{}];
      var columns = [data.x];
      chart.series.forEach(function (line, index) {
        series.push({
          label: line.label,
          stroke: COLORS[index % COLORS.length],
          width: 2,
          // Sparse traffic leaves hours without trajectories (no rate): join the rates around them.
          spanGaps: true,
          points: { show: true, size: 6 },
          value: function (plot, value) { return percent(value); }
        });
        columns.push(line.rates);
      });
      var plot = new window.uPlot({
        width: width,
        height: 220,
        series: series,
        scales: { y: { range: function (plot, min, max) { return [0, Math.max(0.05, Math.min(1, (max || 0) * 1.15))]; } } },
        axes: [{}, { values: function (plot, ticks) { return ticks.map(function (tick) { return Math.round(tick * 100) + "%"; }); }, size: 48 }],
        legend: { live: true }
      }, columns, element);
      element.setAttribute("data-drawn", "true");
      window.addEventListener("resize", function () { plot.setSize({ width: Math.max(element.clientWidth, 280), height: 220 }); });
    });
  }

  document.addEventListener("DOMContentLoaded", draw);
})();
