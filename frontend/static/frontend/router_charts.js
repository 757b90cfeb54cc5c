// Router report charts (frontend/routing/report.html): tier mix, quality and cost per day, with uPlot.
// The data comes from the page (json_script); uPlot is served from frontend/node_modules (no CDN).
(function () {
  "use strict";

  var COLORS = ["#4f46e5", "#059669", "#d97706", "#dc2626", "#0891b2", "#7c3aed"];

  function percent(value) { return value == null ? "—" : (value * 100).toFixed(1) + "%"; }
  function dollars(value) { return value == null ? "—" : "$" + value.toPrecision(3); }
  function plain(value) { return value == null ? "—" : value.toFixed(2); }

  function chart(element, data, kind) {
    var series = [{}];
    var columns = [data.x];
    var axis = {};
    var range = null;
    if (kind === "mix") {
      data.tiers.forEach(function (tier, index) {
        series.push({ label: tier.label, stroke: COLORS[index % COLORS.length], width: 2, spanGaps: true, points: { show: true, size: 6 }, value: function (plot, value) { return percent(value); } });
        columns.push(tier.shares);
      });
      axis = { values: function (plot, ticks) { return ticks.map(function (tick) { return Math.round(tick * 100) + "%"; }); }, size: 48 };
      range = function () { return [0, 1]; };
    } else if (kind === "quality") {
      series.push({ label: "Mean quality", stroke: COLORS[1], width: 2, spanGaps: true, points: { show: true, size: 6 }, value: function (plot, value) { return plain(value); } });
      columns.push(data.quality);
      range = function () { return [0, 1]; };
    } else {
      series.push({ label: "Mean cost", stroke: COLORS[2], width: 2, spanGaps: true, points: { show: true, size: 6 }, value: function (plot, value) { return dollars(value); } });
      columns.push(data.cost);
      axis = { values: function (plot, ticks) { return ticks.map(dollars); }, size: 64 };
    }
    var options = {
      width: Math.max(element.clientWidth, 280),
      height: 220,
      series: series,
      axes: [{}, axis],
      legend: { live: true }
    };
    if (range) { options.scales = { y: { range: range } }; }
    var plot = new window.uPlot(options, columns, element);
    element.setAttribute("data-drawn", "true");
    window.addEventListener("resize", function () { plot.setSize({ width: Math.max(element.clientWidth, 280), height: 220 }); });
  }

  function draw() {
    var source = document.getElementById("router-chart-data");
    if (!source || typeof window.uPlot === "undefined") { return; }
    var data = JSON.parse(source.textContent);
    document.querySelectorAll("[data-router-chart]").forEach(function (element) {
      chart(element, data, element.getAttribute("data-router-chart"));
    });
  }

  document.addEventListener("DOMContentLoaded", draw);
})();
