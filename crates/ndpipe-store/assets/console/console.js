// Shows every <time datetime="..."> in the browser's locale (the page's text is UTC).
(function () {
  function localise(root) {
    root.querySelectorAll("time[datetime]").forEach(function (t) {
      var d = new Date(t.getAttribute("datetime"));
      if (!isNaN(d)) { t.textContent = d.toLocaleString(); t.title = t.getAttribute("datetime"); }
    });
  }
  document.addEventListener("DOMContentLoaded", function () { localise(document); });
  document.addEventListener("htmx:afterSettle", function (e) { localise(e.target); });
})();
