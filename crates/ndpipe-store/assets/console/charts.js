// The console's live charts, drawn with uPlot from JSON the server answers:
// data-chart="job": a Tuner job's progress over time and each run's validation top-1 and
// training loss as it is trained, fetched every second until the job ends;
// data-chart="rates": ingest and label rates, every 5 s.
(function () {
  function get(src) {
    return fetch(src, { credentials: "same-origin" }).then(function (r) {
      if (!r.ok) throw new Error(src + ": " + r.status);
      return r.json();
    });
  }
  function size(el) { return { width: Math.max(el.clientWidth, 300), height: 240 }; }
  function draw(el, opts, data) {
    if (el._plot) { el._plot.setData(data); return; }
    el.textContent = "";
    el._plot = new uPlot(Object.assign(size(el), opts), data, el);
  }
  // Seconds since the job started -> percent done (sampled here), validation top-1 (%) and
  // training loss (right axis) of each run.
  function job(el) {
    var seen = [];
    var opts = {
      scales: { x: { time: false }, loss: {} },
      axes: [{ label: "seconds" }, { label: "%" }, { scale: "loss", side: 1, label: "loss", grid: { show: false } }],
      series: [{ label: "s" },
        { label: "done (%)", stroke: "#2f5fd0", spanGaps: true },
        { label: "val top-1 (%)", stroke: "#12805c", points: { size: 8 }, spanGaps: true },
        { label: "training loss", scale: "loss", stroke: "#b3541e", points: { size: 8 }, spanGaps: true }]
    };
    function tick() {
      get(el.dataset.src).then(function (c) {
        seen.push([c.elapsed, c.percent, null, null]);
        c.runs.forEach(function (r) {
          seen.push([r.train_start + r.train_seconds, null, r.val_top1 * 100, r.train_loss]);
        });
        var rows = seen.slice().sort(function (a, b) { return a[0] - b[0]; });
        draw(el, opts, [0, 1, 2, 3].map(function (i) { return rows.map(function (r) { return r[i]; }); }));
        if (c.runs.length) seen = seen.filter(function (r) { return r[2] === null; });
        el.dataset.phase = c.phase;
        if (!c.ended) setTimeout(tick, 1000);
      }).catch(function (e) { el.dataset.error = e.message; setTimeout(tick, 2000); });
    }
    tick();
  }
  function rates(el) {
    var opts = {
      axes: [{}, { label: "photos/s" }],
      series: [{}, { label: "ingest", stroke: "#2f5fd0" }, { label: "labels", stroke: "#12805c" }]
    };
    function tick() {
      get(el.dataset.src).then(function (rs) {
        draw(el, opts, [rs.map(function (r) { return r.at; }), rs.map(function (r) { return r.ingest; }),
          rs.map(function (r) { return r.label; })]);
      }).catch(function (e) { el.dataset.error = e.message; });
      setTimeout(tick, 5000);
    }
    tick();
  }
  document.addEventListener("DOMContentLoaded", function () {
    document.querySelectorAll("[data-chart=job]").forEach(job);
    document.querySelectorAll("[data-chart=rates]").forEach(rates);
  });
})();
