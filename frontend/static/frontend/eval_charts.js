// Eval metric charts (frontend/evals/suite_detail.html): per evaluator, each completed run's mean, a series
// per prompt version, and the worst subgroup's value dashed beside it. Data from the page (json_script);
// uPlot is served from frontend/node_modules (no CDN).
(function () {
  "use strict";

  var COLORS = ["#4f46e5", "#059669", "#d97706", "#0891b2", "#7c3aed", "#db2777", "#65a30d"];

  function plain(value) { return value == null ? "—" : value.toFixed(3); }

  function draw() {
    var source = document.getElementById("eval-chart-data");
    if (!source || typeof window.uPlot === "undefined") { return; }
    var data = JSON.parse(source.textContent);
    document.querySelectorAll("[data-eval-chart]").forEach(function (element) {
      var chart = data.charts[parseInt(element.getAttribute("data-eval-chart"), 10)];
      var series = [{ label: "Finished" }];
      var columns = [chart.x];
      chart.series.forEach(function (line, index) {
        series.push({
          label: line.label,
          stroke: COLORS[index % COLORS.length],
          width: 2,
          // Runs of other prompt versions leave gaps in a version's series: join its own points.
          spanGaps: true,
          points: { show: true, size: 7 },
          value: function (plot, value) { return plain(value); }
        });
        columns.push(line.values);
      });
      series.push({
        label: "Worst group",
        stroke: "#dc2626",
        width: 1.5,
        dash: [6, 4],
        spanGaps: true,
        points: { show: true, size: 5 },
        value: function (plot, value, seriesIndex, index) {
          return value == null ? "—" : plain(value) + (chart.worst_names[index] ? " (" + chart.worst_names[index] + ")" : "");
        }
      });
      columns.push(chart.worst);
      var width = Math.max(element.clientWidth, 280);
      var plot = new window.uPlot({
        width: width,
        height: 220,
        series: series,
        scales: { y: { range: function (plot, min, max) { return [Math.min(0, min || 0), Math.max(1, max || 0)]; } } },
        axes: [{}, { size: 48 }],
        legend: { live: true }
      }, columns, element);
      element.setAttribute("data-drawn", "true");
      window.addEventListener("resize", function () { plot.setSize({ width: Math.max(element.clientWidth, 280), height: 220 }); });
    });
  }

  document.addEventListener("DOMContentLoaded", draw);
})();
