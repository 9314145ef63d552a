/* fxforge graph viewer, the page half: mounts FXG (graphview.js) into a page with a toolbar, a details
 * panel, search, pan/zoom and module collapse/expand. window.fxgraph is the mounted viewer; the report
 * page and the browser tests drive it through select(), expand(), collapse() and ready.
 */
(function () {
  "use strict";
  var FXG = window.FXG, esc = FXG.esc, num = FXG.num;

  function el(tag, attrs, html) {
    var e = document.createElement(tag);
    Object.keys(attrs || {}).forEach(function (k) { e.setAttribute(k, attrs[k]); });
    if (html != null) e.innerHTML = html;
    return e;
  }

  FXG.mount = function (container, model, options) {
    options = options || {};
    var ix = FXG.index(model);
    var maxDepth = model.modules.reduce(function (a, m) { return Math.max(a, m.depth); }, 0);
    /* The depth menu offers 0..maxDepth: a depth outside it (a model asking for 99) would leave the menu blank. */
    function clampDepth(d) { return Math.max(0, Math.min(+d || 0, maxDepth)); }
    var open = FXG.expandedAt(model, clampDepth(model.depth));
    var view = { x: 0, y: 0, k: 1 }, laid = null, selected = null, matches = {};
    var profile = !!model.profile;
    var busy = Promise.resolve();

    container.classList.add("fxg-viewer");
    var bar = el("div", { class: "fxg-bar" });
    var search = el("input", { type: "search", placeholder: "search nodes and modules\u2026", class: "fxg-search", "aria-label": "search" });
    var results = el("div", { class: "fxg-results" });
    var depthSel = el("select", { class: "fxg-depth", title: "open modules to depth" });
    for (var d = 0; d <= maxDepth; d++) depthSel.appendChild(el("option", { value: d }, d === 0 ? "all collapsed" : "open to depth " + d));
    depthSel.value = clampDepth(model.depth);
    var fit = el("button", { type: "button" }, "fit");
    var svgButton = el("button", { type: "button", title: "download the current view as SVG" }, "SVG");
    var info = el("span", { class: "fxg-info" });
    var searchBox = el("div", { class: "fxg-searchbox" });
    searchBox.appendChild(search); searchBox.appendChild(results);
    [searchBox, depthSel, fit, svgButton, info].forEach(function (x) { bar.appendChild(x); });
    var stage = el("div", { class: "fxg-stage" });
    var side = el("div", { class: "fxg-side" }, '<p class="fxg-hint">Click a node for its details; click <b>+</b> on a module to open it. Drag to pan, wheel to zoom.</p>');
    var legend = el("div", { class: "fxg-legend" });
    var body = el("div", { class: "fxg-body" });
    body.appendChild(stage); body.appendChild(side);
    container.appendChild(bar); container.appendChild(body); container.appendChild(legend);
    legend.innerHTML = legendHtml();

    var svgNS = "http://www.w3.org/2000/svg";
    var svg = document.createElementNS(svgNS, "svg");
    svg.setAttribute("class", "fxg");
    var styleEl = document.createElementNS(svgNS, "style");
    styleEl.textContent = FXG.STYLE;
    var defs = document.createElementNS(svgNS, "g");
    var vp = document.createElementNS(svgNS, "g");
    svg.appendChild(styleEl); svg.appendChild(defs); svg.appendChild(vp);
    stage.appendChild(svg);

    function legendHtml() {
      var items = [];
      if (model.kind === "diff") {
        items.push(sw("#fff9db", "#f08c00", "changed"), sw("#ebfbee", "#2f9e44", "inserted"), sw("#fff5f5", "#e03131", "removed"));
        if (model.divergence) items.push(sw("#fff", "#c92a2a", "first divergence"));
      }
      if (profile) items.push('<span class="fxg-heat"></span> time share (white 0% \u2192 red \u226512%)');
      var used = {};
      model.nodes.forEach(function (n) { if (!n.h) used[n.c] = 1; });
      Object.keys(FXG.COLORS).forEach(function (c) { if (used[c]) items.push('<span class="fxg-sw" style="background:' + FXG.COLORS[c] + '"></span>' + c); });
      items.push('<span class="fxg-sw" style="background:#e7f5ff;border:1px solid #1c7ed6"></span>module (collapsed)');
      return items.join(" ");
    }
    function sw(fill, stroke, label) { return '<span class="fxg-sw" style="background:' + fill + ";border:2px solid " + stroke + '"></span>' + label; }

    function applyView() { vp.setAttribute("transform", "translate(" + view.x + "," + view.y + ") scale(" + view.k + ")"); }

    function fitView() {
      if (!laid) return;
      var W = stage.clientWidth || 800, H = stage.clientHeight || 600;
      var gw = laid.graph.width || 1, gh = laid.graph.height || 1;
      view.k = Math.min(1.2, Math.min(W / gw, H / gh) * 0.96);
      // a tall graph fitted whole is unreadable: keep text legible and show its top instead
      if (view.k < 0.45) view.k = Math.min(1, Math.max(0.45, W / gw * 0.96));
      view.x = (W - gw * view.k) / 2; view.y = 8;
      if (gw * view.k > W) view.x = 8;
      applyView();
    }

    function centerOn(key) {
      var b = findBox(key);
      if (!b) return;
      var W = stage.clientWidth || 800, H = stage.clientHeight || 600;
      view.k = Math.max(view.k, 0.8);
      view.x = W / 2 - (b.x + b.width / 2) * view.k;
      view.y = H / 2 - (b.y + b.height / 2) * view.k;
      applyView();
    }

    function findBox(key) {
      var found = null;
      (function walk(c) { (c.children || []).forEach(function (x) { if (x.id === key) found = x; else walk(x); }); })(laid.graph);
      if (!found && key[0] === "m" && open[+key.slice(1)]) {
        // an open module drawn without its box (mod.il): its first node stands for it
        var first = firstNode(+key.slice(1));
        if (first != null) return findBox("n" + first);
      }
      return found;
    }

    function firstNode(m) {
      if (ix.modNodes[m].length) return ix.modNodes[m][0];
      for (var k = 0; k < ix.childMods[m].length; k++) { var i = firstNode(ix.childMods[m][k]); if (i != null) return i; }
      return null;
    }

    function render() {
      var t0 = performance.now();
      return FXG.layout(model, open, {}).then(function (result) {
        laid = result;
        var parts = FXG.svg(model, laid, { profile: profile, inner: true });
        defs.innerHTML = parts.defs;
        vp.innerHTML = parts.body;
        var shown = vp.querySelectorAll("g.node").length;
        info.textContent = shown + " shown \u00b7 " + model.nodes.filter(function (n) { return !n.h; }).length + " nodes \u00b7 laid out in " + Math.round(performance.now() - t0) + " ms";
        mark();
        return laid;
      });
    }

    function mark() {
      vp.querySelectorAll(".sel,.match").forEach(function (e) { e.classList.remove("sel", "match"); });
      vp.querySelectorAll(".edge.hl").forEach(function (e) { e.classList.remove("hl"); });
      Object.keys(matches).forEach(function (k) { var e = vp.querySelector('[data-k="' + k + '"]'); if (e) e.classList.add("match"); });
      if (selected) {
        var e = vp.querySelector('g.node[data-k="' + selected + '"]');
        if (e) e.classList.add("sel");
        vp.querySelectorAll("g.edge").forEach(function (g) {
          var ends = g.getAttribute("data-e").split(">");
          if (ends[0] === selected || ends[1] === selected) g.classList.add("hl");
        });
      }
    }

    function queue(work) { busy = busy.then(work, work); return busy; }

    function setOpen(m, value) {
      if (!!open[m] === value) return Promise.resolve(laid);
      if (value) FXG.ancestors(model, m).forEach(function (a) { open[a] = true; });
      else {
        delete open[m];
        (function close(x) { ix.childMods[x].forEach(function (c) { delete open[c]; close(c); }); })(m);
      }
      return render();
    }

    /* Select a node (by name) or module (by path): open its modules, lay out, centre and show details.
     * ``kind`` ("module" or "node") says which a name shared by both is (an nn.Sequential named ``relu``
     * beside a torch.relu call); left out, the node. */
    function select(name, kind) { return queue(function () { return selectNow(name, kind); }); }

    function keyOf(name, kind) {
      var i = ix.byName[name], m = ix.byPath[name];
      if (kind !== "module" && i != null && !model.nodes[i].h) return "n" + i;
      if (kind !== "node" && m != null) return "m" + m;
      return null;
    }

    function selectNow(name, kind) {
      {
        var key = keyOf(name, kind), m;
        if (key == null) return Promise.resolve(false);
        m = key[0] === "n" ? model.nodes[+key.slice(1)].m : model.modules[+key.slice(1)].parent;
        var need = FXG.ancestors(model, m).some(function (a) { return !open[a]; });
        var p = Promise.resolve(laid);
        if (need) { FXG.ancestors(model, m).forEach(function (a) { open[a] = true; }); p = render(); }
        if (key[0] === "m" && open[+key.slice(1)]) { /* an open module: select its box */ }
        return p.then(function () { selected = key; mark(); centerOn(key); details(key); return true; });
      }
    }

    function nodeLink(i) {
      var n = model.nodes[i];
      return '<a href="#" data-go="' + esc(n.n) + '">' + esc(n.n) + "</a>";
    }

    function details(key) {
      var isMod = key[0] === "m", id = +key.slice(1), rows = [], html;
      if (isMod) {
        var mod = model.modules[id];
        rows.push(["module", mod.path], ["type", mod.type], ["nodes", mod.nodes], ["params", (mod.p || 0).toLocaleString()], ["FLOPs", num(mod.f)]);
        if (mod.ms != null) rows.push(["time", mod.ms.toFixed(3) + " ms (" + (100 * (mod.share || 0)).toFixed(1) + "%)"]);
        if (mod.il) rows.push(["drawn", "without its box when open: a path leaves and re-enters it"]);
        if (!ix.modShown[id]) rows.push(["nodes drawn", "in the boxes of consecutive nodes around it"]);
        html = "<h3>" + esc(mod.path) + "</h3>" + table(rows) + '<button type="button" data-toggle="' + id + '">' + (open[id] ? "collapse" : "expand") + "</button>";
      } else {
        var n = model.nodes[id];
        rows.push(["op", n.op], ["target", n.t], ["module", (n.mp || n.im || (n.m >= 0 ? model.modules[n.m].path : "")) + (n.mt ? " (" + n.mt + ")" : "")]);
        if (n.sh) rows.push(["output", n.sh + (n.dt ? " " + n.dt : "")]);
        if (n.p) rows.push(["params", n.p.toLocaleString()]);
        if (n.f) rows.push(["FLOPs", n.f.toLocaleString() + " (" + num(n.f) + ")"]);
        if (n.ms != null) rows.push(["time", n.ms.toFixed(3) + " ms (" + (100 * (n.share || 0)).toFixed(1) + "%)"]);
        if (n.bd) rows.push(["bound", n.bd]);
        if (n.st) rows.push(["diff", n.st + (n.ps ? " by pass " + n.ps : "")]);
        else if (n.ps) rows.push(["pass", n.ps]);
        if (n.o) rows.push(["computes", "the value of " + n.o + " in the captured graph"]);
        if (n.heir) rows.push(["now computed by", n.heir]);
        html = "<h3>" + esc(n.n) + "</h3>" + table(rows);
        // modules drawn open without a box have no - to click: they close from here
        FXG.ancestors(model, n.m).forEach(function (a) {
          if (model.modules[a].il && open[a]) html += '<button type="button" data-toggle="' + a + '">collapse ' + esc(model.modules[a].path) + "</button> ";
        });
        if (n.src) {
          var s = n.src;
          html += '<div class="fxg-src"><b>' + (s.exact ? "source" : "called from") + "</b> " + esc(s.file) + ":" + s.line + " in " + esc(s.fn) +
            (s.code ? "<pre>" + esc(s.code) + "</pre>" : "") + "</div>";
        }
        if (n.div && model.divergence) html += '<p class="fxg-div">First divergence: max abs error ' + Number(model.divergence.max_abs_err).toPrecision(3) + " against reference node " + esc(model.divergence.reference_node) + ".</p>";
        (n.lint || []).forEach(function (f) {
          var x = model.findings[f];
          html += '<p class="fxg-lint ' + esc(x.severity) + '"><b>' + esc(x.code) + " " + esc(x.name) + "</b> " + esc(x.message) + (x.fix ? " (fix: " + esc(x.fix) + ")" : "") + "</p>";
        });
        var ins = ix.inputs[id].filter(function (j) { return !model.nodes[j].h; });
        var outs = ix.users[id].filter(function (j) { return !model.nodes[j].h; });  // not the checks of its value
        var weights = ix.inputs[id].filter(function (j) { return model.nodes[j].h; });
        if (ins.length) html += "<p><b>inputs</b> " + ins.map(nodeLink).join(", ") + "</p>";
        if (weights.length) html += "<p><b>weights</b> " + weights.map(function (j) { return esc(model.nodes[j].t) + (model.nodes[j].sh ? " " + esc(model.nodes[j].sh) : ""); }).join(", ") + "</p>";
        if (outs.length) html += "<p><b>users</b> " + outs.map(nodeLink).join(", ") + "</p>";
      }
      side.innerHTML = html;
    }

    function table(rows) {
      return "<table>" + rows.map(function (r) { return "<tr><th>" + esc(r[0]) + "</th><td>" + esc(r[1]) + "</td></tr>"; }).join("") + "</table>";
    }

    side.addEventListener("click", function (ev) {
      var a = ev.target.closest("[data-go]");
      if (a) { ev.preventDefault(); select(a.getAttribute("data-go")); return; }
      var b = ev.target.closest("[data-toggle]");
      if (b) {
        var m = +b.getAttribute("data-toggle");
        queue(function () { return setOpen(m, !open[m]).then(function () { details("m" + m); }); });
      }
    });

    // clicks: a module's +/- toggles it; a node or collapsed module shows its details
    var dragged = false;
    vp.addEventListener("click", function (ev) {
      if (dragged) return;
      var t = ev.target.closest("[data-t]");
      if (t) {
        var m = +t.getAttribute("data-t").slice(1);
        queue(function () { return setOpen(m, !open[m]); });
        return;
      }
      var g = ev.target.closest("g.node[data-k]");
      if (g) { selected = g.getAttribute("data-k"); mark(); details(selected); }
    });
    vp.addEventListener("dblclick", function (ev) {
      var g = ev.target.closest("[data-k]");
      if (g && g.getAttribute("data-k")[0] === "m") {
        var m = +g.getAttribute("data-k").slice(1);
        queue(function () { return setOpen(m, !open[m]); });
      }
    });

    // pan and zoom
    var drag = null;
    svg.addEventListener("mousedown", function (ev) { drag = { x: ev.clientX, y: ev.clientY, vx: view.x, vy: view.y }; dragged = false; });
    window.addEventListener("mousemove", function (ev) {
      if (!drag) return;
      var dx = ev.clientX - drag.x, dy = ev.clientY - drag.y;
      if (Math.abs(dx) + Math.abs(dy) > 3) dragged = true;
      view.x = drag.vx + dx; view.y = drag.vy + dy; applyView();
    });
    window.addEventListener("mouseup", function () { drag = null; setTimeout(function () { dragged = false; }, 0); });
    svg.addEventListener("wheel", function (ev) {
      ev.preventDefault();
      var r = svg.getBoundingClientRect(), px = ev.clientX - r.left, py = ev.clientY - r.top;
      var k = Math.max(0.05, Math.min(4, view.k * Math.exp(-ev.deltaY * 0.0015)));
      view.x = px - (px - view.x) * k / view.k; view.y = py - (py - view.y) * k / view.k; view.k = k;
      applyView();
    }, { passive: false });

    // search
    function find(q) {
      q = q.trim().toLowerCase();
      if (!q) return [];
      var out = [];
      model.modules.forEach(function (m) { if (out.length < 30 && m.path.toLowerCase().indexOf(q) >= 0) out.push({ name: m.path, kind: "module " + m.type, mod: true }); });
      model.nodes.forEach(function (n) {
        if (out.length < 30 && !n.h && (n.n.toLowerCase().indexOf(q) >= 0 || String(n.t).toLowerCase().indexOf(q) >= 0 || (n.mp || n.im || "").toLowerCase().indexOf(q) >= 0)) out.push({ name: n.n, kind: n.l });
      });
      return out;
    }
    search.addEventListener("input", function () {
      var found = find(search.value);
      matches = {};
      found.forEach(function (f) { var key = keyOf(f.name, f.mod ? "module" : "node"); if (key) matches[key] = 1; });
      mark();
      results.innerHTML = found.map(function (f) {
        return '<div data-go="' + esc(f.name) + '" data-kind="' + (f.mod ? "module" : "node") + '">' + esc(f.name) + " <small>" + esc(f.kind) + "</small></div>";
      }).join("");
      results.style.display = found.length ? "block" : "none";
    });
    search.addEventListener("keydown", function (ev) {
      if (ev.key === "Enter") { var first = results.querySelector("[data-go]"); if (first) { results.style.display = "none"; select(first.getAttribute("data-go"), first.getAttribute("data-kind")); } }
      if (ev.key === "Escape") { results.style.display = "none"; }
    });
    results.addEventListener("click", function (ev) {
      var d = ev.target.closest("[data-go]");
      if (d) { results.style.display = "none"; select(d.getAttribute("data-go"), d.getAttribute("data-kind")); }
    });

    depthSel.addEventListener("change", function () {
      queue(function () { open = FXG.expandedAt(model, +depthSel.value); return render().then(fitView); });
    });
    fit.addEventListener("click", fitView);
    svgButton.addEventListener("click", function () {
      var text = FXG.svg(model, laid, { profile: profile });
      var a = el("a", { href: URL.createObjectURL(new Blob([text], { type: "image/svg+xml" })), download: (model.title || "graph").replace(/[^\w.-]+/g, "_") + ".svg" });
      document.body.appendChild(a); a.click(); a.remove();
    });

    var api = {
      model: model,
      select: select,
      expand: function (path) { return queue(function () { return setOpen(ix.byPath[path], true); }); },
      collapse: function (path) { return queue(function () { return setOpen(ix.byPath[path], false); }); },
      setDepth: function (d) { d = clampDepth(d); depthSel.value = d; return queue(function () { open = FXG.expandedAt(model, d); return render().then(fitView); }); },
      isOpen: function (path) { return !!open[ix.byPath[path]]; },
      selected: function () { return selected; },
      fit: fitView
    };
    api.ready = queue(function () {
      return render().then(function () {
        fitView();
        // a failed verification opens on its first diverging node (inside this queued step: no second queue)
        if (model.divergence && model.divergence.i >= 0) return selectNow(model.nodes[model.divergence.i].n);
      });
    });
    return api;
  };

  function boot() {
    var host = document.getElementById("fxg-graph");
    var data = document.getElementById("fxg-model");
    if (!host || !data) return;
    var t0 = performance.now();
    var model = JSON.parse(data.textContent);
    window.fxgraph = FXG.mount(host, model);
    window.fxgraph.ready.then(function () {
      window.fxgraphReadyMs = performance.now() - t0;
      document.body.setAttribute("data-ready", "1");
    }, function (err) {
      host.insertAdjacentHTML("afterbegin", '<p class="fxg-error">The graph could not be laid out: ' + esc(err && err.message || err) + "</p>");
      throw err;
    });
  }
  if (document.readyState === "loading") document.addEventListener("DOMContentLoaded", boot); else boot();
})();
