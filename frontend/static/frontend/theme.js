// Light/dark toggle. Without a stored choice the page follows the system (prefers-color-scheme, in app.css);
// a click pins the opposite of what is shown now and remembers it in localStorage.
(function () {
  "use strict";
  var KEY = "draservice-theme";
  var root = document.documentElement;

  function shown() {
    var chosen = root.getAttribute("data-theme");
    if (chosen === "dark" || chosen === "light") return chosen;
    return window.matchMedia && window.matchMedia("(prefers-color-scheme: dark)").matches ? "dark" : "light";
  }

  function label(button) {
    button.textContent = shown() === "dark" ? "Light mode" : "Dark mode";
  }

  function init() {
    var button = document.querySelector("[data-testid=theme-toggle]");
    if (!button) return;
    label(button);
    button.addEventListener("click", function () {
      var next = shown() === "dark" ? "light" : "dark";
      root.setAttribute("data-theme", next);
      try { localStorage.setItem(KEY, next); } catch (e) { /* private mode: the choice lasts for this page */ }
      label(button);
      document.dispatchEvent(new CustomEvent("draservice:theme", { detail: next }));
    });
    // Following the system: the label names the other theme after the system switches, too.
    if (window.matchMedia) {
      var mq = window.matchMedia("(prefers-color-scheme: dark)");
      if (mq.addEventListener) mq.addEventListener("change", function () { label(button); });
    }
  }

  if (document.readyState === "loading") document.addEventListener("DOMContentLoaded", init);
  else init();
})();
