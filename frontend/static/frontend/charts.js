// Utilisation charts: reads the JSON the page embeds (json_script) and draws it with the vendored Chart.js.
// The server sends the x labels already formatted (UTC, 24-hour) and a null wherever a snapshot is missing:
// lines are straight between points and break at nulls (spanGaps off), so nothing is drawn that was not seen.
(function () {
  "use strict";
  var PALETTE = ["#2f6fde", "#7b4fd0", "#2f9e6a", "#d08a12", "#c93b3b", "#1f9bb0", "#8c96a3", "#b0568c", "#5b6b2f"];
  var charts = [];

  function data(id) {
    var el = document.getElementById(id);
    return el ? JSON.parse(el.textContent) : null;
  }

  function cssVar(name) {
    return getComputedStyle(document.documentElement).getPropertyValue(name).trim();
  }

  function baseOptions(yTitle, max) {
    return {
      responsive: true, maintainAspectRatio: false, animation: false, spanGaps: false,
      interaction: { mode: "index", intersect: false },
      plugins: { legend: { position: "bottom", labels: { boxWidth: 10 } } },
      scales: {
        x: { ticks: { maxTicksLimit: 8, autoSkip: true, maxRotation: 0 }, grid: { display: false },
             title: { display: true, text: "time (UTC, 24-hour)" } },
        y: { beginAtZero: true, max: max, title: { display: true, text: yTitle } }
      },
      // tension 0: straight segments; a smoothed curve overshoots (below 0 %, above the total) between points.
      elements: { point: { radius: 0, hitRadius: 4 }, line: { borderWidth: 2, tension: 0 } }
    };
  }

  function percentChart(canvasId, series) {
    var canvas = document.getElementById(canvasId);
    if (!canvas || !series) return;
    charts.push(new Chart(canvas, {
      type: "line",
      data: {
        labels: series.labels,
        datasets: series.series.map(function (s, i) {
          return { label: s.label, data: s.data, borderColor: PALETTE[i % PALETTE.length],
                   backgroundColor: PALETTE[i % PALETTE.length] };
        })
      },
      options: baseOptions("% of published devices allocated", 100)
    }));
  }

  function fleetChart() {
    var canvas = document.getElementById("chart-fleet");
    var fleet = data("data-fleet");
    if (!canvas || !fleet) return;
    var o = baseOptions("devices allocated / shares");
    // The published total includes every partition placement a MIG GPU offers, so it lives on its own
    // axis: on one shared axis it would flatten the allocation curve.
    o.scales.total = { position: "right", beginAtZero: true, grid: { display: false },
                       title: { display: true, text: "devices published" } };
    charts.push(new Chart(canvas, {
      type: "line",
      data: {
        labels: fleet.labels,
        datasets: [
          { label: "allocated (devices)", data: fleet.allocated, borderColor: "#2f6fde", backgroundColor: "rgba(47,111,222,.15)", fill: true },
          { label: "shares (claims sharing a device)", data: fleet.shares, borderColor: "#7b4fd0", backgroundColor: "#7b4fd0" },
          { label: "published (devices, right axis)", data: fleet.total, borderColor: "#8c96a3", backgroundColor: "#8c96a3",
            borderDash: [4, 4], yAxisID: "total" }
        ]
      },
      options: o
    }));
  }

  function historyChart() {
    var canvas = document.getElementById("chart-history");
    var h = data("data-history");
    if (!canvas || !h) return;
    var o = baseOptions("devices / claims");
    o.scales.y.ticks = { precision: 0 };
    // At the node's scale (all its devices), so a few devices held do not fill the chart.
    if (h.scale) { o.scales.y.min = 0; o.scales.y.suggestedMax = h.scale; }
    // Stepped: a count holds until the next step, there is nothing in between to interpolate.
    charts.push(new Chart(canvas, {
      type: "line",
      data: {
        labels: h.labels,
        datasets: [
          { label: "devices held", data: h.held, borderColor: "#2f6fde", backgroundColor: "rgba(47,111,222,.15)", fill: true, stepped: true },
          { label: "devices shared", data: h.shared, borderColor: "#7b4fd0", backgroundColor: "#7b4fd0", stepped: true },
          { label: "claims", data: h.claims, borderColor: "#d08a12", backgroundColor: "#d08a12", borderDash: [4, 3], stepped: true }
        ]
      },
      options: o
    }));
  }

  function draw() {
    if (typeof Chart === "undefined") return;
    // Axis text and grid follow the page's theme (light or dark).
    Chart.defaults.color = cssVar("--muted") || "#566270";
    Chart.defaults.borderColor = cssVar("--line") || "#e2e6ec";
    charts.forEach(function (c) { c.destroy(); });
    charts = [];
    fleetChart();
    percentChart("chart-cluster", data("data-cluster"));
    percentChart("chart-product", data("data-product"));
    historyChart();
    document.body.setAttribute("data-charts-ready", "true");
  }

  document.addEventListener("draservice:theme", draw);
  if (window.matchMedia) {
    var mq = window.matchMedia("(prefers-color-scheme: dark)");
    if (mq.addEventListener) mq.addEventListener("change", draw);
  }
  if (document.readyState === "loading") document.addEventListener("DOMContentLoaded", draw);
  else draw();
})();
