// Usage page: device-hours per bucket, stacked by the chosen grouping (the JSON the page embeds), with the
// vendored Chart.js the other dashboard charts use.
(function () {
  "use strict";
  var PALETTE = ["#2f6fde", "#7b4fd0", "#2f9e6a", "#d08a12", "#c93b3b", "#1f9bb0", "#8c96a3", "#b0568c", "#5b6b2f"];

  function draw() {
    var canvas = document.getElementById("chart-usage");
    var el = document.getElementById("data-usage");
    if (typeof Chart === "undefined" || !canvas || !el) return;
    var data = JSON.parse(el.textContent);
    new Chart(canvas, {
      type: "bar",
      data: {
        labels: data.labels,
        datasets: data.series.map(function (s, i) {
          return { label: s.label, data: s.data, backgroundColor: PALETTE[i % PALETTE.length], stack: "usage" };
        })
      },
      options: {
        responsive: true, maintainAspectRatio: false, animation: false,
        interaction: { mode: "index", intersect: false },
        plugins: { legend: { position: "bottom", labels: { boxWidth: 10 } } },
        scales: {
          x: { stacked: true, grid: { display: false } },
          y: { stacked: true, beginAtZero: true, title: { display: true, text: "device-hours" } }
        }
      }
    });
    document.body.setAttribute("data-charts-ready", "true");
  }

  if (document.readyState === "loading") document.addEventListener("DOMContentLoaded", draw);
  else draw();
})();
