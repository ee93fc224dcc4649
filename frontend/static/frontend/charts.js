// Utilisation charts: reads the JSON the page embeds (json_script) and draws it with the vendored Chart.js.
(function () {
  "use strict";
  var PALETTE = ["#2f6fde", "#7b4fd0", "#2f9e6a", "#d08a12", "#c93b3b", "#1f9bb0", "#8c96a3", "#b0568c", "#5b6b2f"];

  function data(id) {
    var el = document.getElementById(id);
    return el ? JSON.parse(el.textContent) : null;
  }

  function label(iso) {
    var d = new Date(iso);
    return d.toLocaleString([], { month: "short", day: "numeric", hour: "2-digit", minute: "2-digit" });
  }

  function baseOptions(yTitle, max) {
    return {
      responsive: true, maintainAspectRatio: false, animation: false, spanGaps: true,
      interaction: { mode: "index", intersect: false },
      plugins: { legend: { position: "bottom", labels: { boxWidth: 10 } } },
      scales: {
        x: { ticks: { maxTicksLimit: 8, autoSkip: true }, grid: { display: false } },
        y: { beginAtZero: true, max: max, title: { display: true, text: yTitle } }
      },
      elements: { point: { radius: 0 }, line: { borderWidth: 2, tension: 0.2 } }
    };
  }

  function percentChart(canvasId, series) {
    var canvas = document.getElementById(canvasId);
    if (!canvas || !series) return;
    new Chart(canvas, {
      type: "line",
      data: {
        labels: series.labels.map(label),
        datasets: series.series.map(function (s, i) {
          return { label: s.label, data: s.data, borderColor: PALETTE[i % PALETTE.length],
                   backgroundColor: PALETTE[i % PALETTE.length] };
        })
      },
      options: baseOptions("% allocated", 100)
    });
  }

  function fleetChart() {
    var canvas = document.getElementById("chart-fleet");
    var fleet = data("data-fleet");
    if (!canvas || !fleet) return;
    new Chart(canvas, {
      type: "line",
      data: {
        labels: fleet.labels.map(label),
        datasets: [
          { label: "allocated", data: fleet.allocated, borderColor: "#2f6fde", backgroundColor: "rgba(47,111,222,.15)", fill: true },
          { label: "shares", data: fleet.shares, borderColor: "#7b4fd0", backgroundColor: "#7b4fd0" },
          { label: "published (right axis)", data: fleet.total, borderColor: "#8c96a3", backgroundColor: "#8c96a3",
            borderDash: [4, 4], yAxisID: "total" }
        ]
      },
      options: (function () {
        // The published total includes every partition placement a MIG GPU offers, so it lives on its own
        // axis: on one shared axis it would flatten the allocation curve.
        var o = baseOptions("devices in use");
        o.scales.total = { position: "right", beginAtZero: true, grid: { display: false },
                           title: { display: true, text: "devices published" } };
        return o;
      })()
    });
  }

  function draw() {
    if (typeof Chart === "undefined") return;
    fleetChart();
    percentChart("chart-cluster", data("data-cluster"));
    percentChart("chart-product", data("data-product"));
    document.body.setAttribute("data-charts-ready", "true");
  }

  if (document.readyState === "loading") document.addEventListener("DOMContentLoaded", draw);
  else draw();
})();
