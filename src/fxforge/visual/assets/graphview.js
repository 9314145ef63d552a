/* fxforge graph viewer: lays out a graph model (fxforge/visual/graph.py) with ELK and draws it as SVG.
 *
 * Two halves. The pure half (FXG.layout, FXG.svg) needs no DOM: fxforge runs it in an embedded V8 to write
 * .svg files, so a picture on disk and the page look the same. The page half (FXG.mount) adds what a person
 * needs: collapse/expand modules (each change re-lays out only what is visible), pan and zoom, search,
 * details with the source line, lint findings that select their node, diff and profile colours.
 * No network: everything is in this file, elk.bundled.js and the model embedded in the page.
 */
(function (root) {
  "use strict";
  var FXG = {};
  var CW = 6.7;        // advance of one character of the 11px monospace font (measured in Chromium: 6.62)
  var LH = 14;         // line height
  var PAD = 8;
  var HEAD = 18;       // a node's coloured header band
  var MAXCH = 40;      // longest text line in a node, in characters
  var COLORS = {
    conv: "#2f6fde", matmul: "#7048e8", norm: "#0c8599", activation: "#e8590c", pool: "#2b8a3e",
    dropout: "#868e96", shape: "#909aa3", elementwise: "#c2255c", io: "#343a40", param: "#adb5bd",
    quant: "#1098ad", other: "#495057", module: "#1c7ed6"
  };
  FXG.COLORS = COLORS;

  function esc(s) {
    return String(s == null ? "" : s).replace(/[&<>"']/g, function (c) {
      return { "&": "&amp;", "<": "&lt;", ">": "&gt;", '"': "&quot;", "'": "&#39;" }[c];
    });
  }
  FXG.esc = esc;
  function clip(s, n) { s = String(s); n = n || MAXCH; return s.length > n ? s.slice(0, n - 1) + "\u2026" : s; }
  function num(v) {
    if (v == null) return "-";
    var a = Math.abs(v), units = [[1e12, "T"], [1e9, "G"], [1e6, "M"], [1e3, "K"]];
    for (var i = 0; i < units.length; i++) if (a >= units[i][0]) return (v / units[i][0]).toFixed(a >= 100 * units[i][0] ? 0 : 1) + units[i][1];
    return String(Math.round(v * 100) / 100);
  }
  FXG.num = num;

  /* ---------------------------------------------------------------- the model, indexed */

  FXG.index = function (model) {
    if (model._ix) return model._ix;
    var mods = model.modules, nodes = model.nodes;
    var ix = { childMods: [], rootMods: [], modNodes: [], rootNodes: [], byName: {}, byPath: {}, users: [], inputs: [],
               modStatus: [], modLint: [], modShare: [], modShown: [] };
    for (var m = 0; m < mods.length; m++) { ix.childMods.push([]); ix.modNodes.push([]); ix.modStatus.push({}); ix.modLint.push(0); ix.modShare.push(0); ix.modShown.push(0); ix.byPath[mods[m].path] = m; }
    for (m = 0; m < mods.length; m++) { if (mods[m].parent >= 0) ix.childMods[mods[m].parent].push(m); else ix.rootMods.push(m); }
    for (var i = 0; i < nodes.length; i++) {
      var n = nodes[i];
      ix.users.push([]); ix.inputs.push([]);
      if (!(n.n in ix.byName) || n.st !== "removed") ix.byName[n.n] = i;
      if (n.h) continue;
      if (n.m >= 0) ix.modNodes[n.m].push(i); else ix.rootNodes.push(i);
      for (var a = n.m; a >= 0; a = mods[a].parent) {
        ix.modShown[a]++;
        if (n.st && n.st !== "unchanged") ix.modStatus[a][n.st] = (ix.modStatus[a][n.st] || 0) + 1;
        if (n.lint) ix.modLint[a] += n.lint.length;
        if (n.share) ix.modShare[a] += n.share;
        if (n.div) ix.modStatus[a].div = 1;
      }
    }
    model.edges.forEach(function (e) { ix.users[e[0]].push(e[1]); ix.inputs[e[1]].push(e[0]); });
    model._ix = ix;
    return ix;
  };

  FXG.ancestors = function (model, m) { var out = []; for (; m >= 0; m = model.modules[m].parent) out.unshift(m); return out; };

  /* The modules open when a page opens: every module up to ``depth``. */
  FXG.expandedAt = function (model, depth) {
    var open = {};
    model.modules.forEach(function (mod, m) { if (mod.depth <= depth) open[m] = true; });
    return open;
  };

  /* What stands for node i in the visible graph: the node itself, or its outermost collapsed module. */
  function representative(model, open, i) {
    var mods = model.modules, chain = [];
    for (var m = model.nodes[i].m; m >= 0; m = mods[m].parent) chain.push(m);
    for (var k = chain.length - 1; k >= 0; k--) if (!open[chain[k]]) return "m" + chain[k];
    return "n" + i;
  }

  /* ---------------------------------------------------------------- sizes and text */

  function nodeLines(model, n) {
    var title = n.mt ? n.mt + " \u00b7 " + n.l : n.l;
    var lines = [];
    var name = n.mp || n.n;
    if (name !== title) lines.push(name);
    if (n.sh) lines.push(n.sh + (n.dt ? " " + n.dt : ""));
    var stats = [];
    if (n.p) stats.push(num(n.p) + " params");
    if (n.f) stats.push(num(n.f) + " FLOPs");
    if (stats.length) lines.push(stats.join(" \u00b7 "));
    if (n.ms != null) lines.push(n.ms.toFixed(3) + " ms \u00b7 " + (100 * (n.share || 0)).toFixed(1) + "%" + (n.bd ? " \u00b7 bound: " + n.bd : ""));
    if (n.st && n.st !== "unchanged") lines.push(n.st + (n.ps ? " by " + n.ps : ""));
    return { title: title, lines: lines };
  }

  function moduleLines(model, ix, m) {
    var mod = model.modules[m];
    var title = mod.path.split(".").pop() + (mod.type ? " \u00b7 " + mod.type : "");
    var lines = [mod.path];
    lines.push(num(mod.nodes) + " nodes" + (mod.p ? " \u00b7 " + num(mod.p) + " params" : ""));
    if (mod.f) lines.push(num(mod.f) + " FLOPs");
    var st = ix.modStatus[m], parts = [];
    ["removed", "inserted", "changed"].forEach(function (k) { if (st[k]) parts.push(st[k] + " " + k); });
    if (parts.length) lines.push(parts.join(", "));
    if (mod.ms != null) lines.push(mod.ms.toFixed(3) + " ms \u00b7 " + (100 * (mod.share || 0)).toFixed(1) + "%");
    return { title: title, lines: lines };
  }

  function boxSize(text) {
    var longest = Math.max(text.title.length + 3, 10), lines = text.lines.concat(text.notes || []);
    lines.forEach(function (l) { longest = Math.max(longest, Math.min(l.length, MAXCH)); });
    return { width: Math.ceil(Math.min(longest, MAXCH) * CW + 2 * PAD), height: HEAD + lines.length * LH + PAD };
  }

  /* ---------------------------------------------------------------- layout (ELK) */

  /* A value read by more visible boxes than this (a transformer's attention mask, rotary cos/sin: one edge
   * into each of 32 layers) is drawn with one edge, to its first reader; the others name it in a line of
   * their own ("<- where") instead. Every such edge crossing the graph took a lane of its own: a collapsed
   * 7B Llama was laid out 6,900 px wide with the layers staircased beside a bus of 96 edges. */
  var FANOUT = 4;
  FXG.FANOUT = FANOUT;

  function keyName(model, key) {
    var id = +key.slice(1);
    return key[0] === "m" ? model.modules[id].path : model.nodes[id].n;
  }

  /* The visible graph for the open modules, as an ELK graph; ``opts.edgeLabels`` puts the tensor shape on
   * every edge (left out on very large views: each label is one more thing to place). */
  FXG.elkGraph = function (model, open, opts) {
    opts = opts || {};
    var ix = FXG.index(model), nodes = model.nodes;
    // edges first: a box's size depends on the fanned-out values it reads (see FANOUT)
    var seen = {}, edges = [], count = 0, readers = {};
    model.edges.forEach(function (e) {
      if (nodes[e[0]].h || nodes[e[1]].h) return;
      var a = representative(model, open, e[0]), b = representative(model, open, e[1]);
      if (a === b) return;
      var k = a + ">" + b;
      if (seen[k] != null) { if (!e[2]) edges[seen[k]].old = false; return; }
      seen[k] = edges.length;
      edges.push({ id: "e" + (count++), sources: [a], targets: [b], src: e[0], old: !!e[2] });
    });
    edges.forEach(function (e) { if (!e.old) readers[e.sources[0]] = (readers[e.sources[0]] || 0) + 1; });
    var reads = {}, drawn = {};
    edges = edges.filter(function (e) {
      var a = e.sources[0];
      if (e.old || readers[a] <= FANOUT) return true;  // a removed node's old edges are always drawn
      if (!drawn[a]) { drawn[a] = true; return true; }
      (reads[e.targets[0]] = reads[e.targets[0]] || []).push(keyName(model, a));
      return false;
    });
    var texts = {};
    function contents(id, into) {
      ix.childMods[id].forEach(function (c) { item("m" + c, into); });
      ix.modNodes[id].forEach(function (i) { item("n" + i, into); });
    }
    // appends the ELK node(s) of ``key`` to ``into``
    function item(key, into) {
      var isMod = key[0] === "m", id = +key.slice(1);
      // no visible node inside: an interleaved module whose nodes graph.py boxed with the place around it
      if (isMod && !ix.modShown[id]) return;
      if (isMod && open[id]) {
        var mod = model.modules[id];
        // a path leaves and re-enters it (graph.py's mark_interleaved): as a box, ELK spends minutes on the
        // edges crossing its border, so its contents go where it sits
        if (mod.il) return contents(id, into);
        var kids = [];
        contents(id, kids);
        texts[key] = { title: (mod.path.split(".").pop()) + (mod.type ? " \u00b7 " + mod.type : ""), lines: [], open: true };
        into.push({ id: key, children: kids, layoutOptions: { "elk.padding": "[top=" + (HEAD + 10) + ",left=10,bottom=10,right=10]" } });
        return;
      }
      var text = isMod ? moduleLines(model, ix, id) : nodeLines(model, nodes[id]);
      if (reads[key]) text.notes = ["\u2190 " + reads[key].join(", ")];
      texts[key] = text;
      var size = boxSize(text);
      into.push({ id: key, width: size.width, height: size.height });
    }
    var children = [];
    ix.rootMods.forEach(function (m) { item("m" + m, children); });
    ix.rootNodes.forEach(function (i) { item("n" + i, children); });
    var labels = opts.edgeLabels !== false && edges.length <= 700;
    edges.forEach(function (e) {
      var sh = nodes[e.src].sh;
      if (labels && sh) { var t = clip(sh, 28); e.labels = [{ text: t, width: t.length * 5.6 + 4, height: 11 }]; }
    });
    return {
      graph: {
        id: "root",
        layoutOptions: {
          "elk.algorithm": "layered", "elk.direction": "DOWN", "elk.hierarchyHandling": "INCLUDE_CHILDREN",
          "elk.edgeRouting": "ORTHOGONAL", "elk.layered.spacing.nodeNodeBetweenLayers": "26",
          "elk.spacing.nodeNode": "18", "elk.layered.spacing.edgeNodeBetweenLayers": "12",
          "elk.spacing.edgeLabel": "2", "elk.edgeLabels.placement": "CENTER",
          "elk.layered.nodePlacement.strategy": "BRANDES_KOEPF", "elk.layered.considerModelOrder.strategy": "NODES_AND_EDGES",
          "elk.json.edgeCoords": "ROOT", "elk.json.shapeCoords": "ROOT", "elk.padding": "[top=16,left=16,bottom=16,right=16]"
        },
        children: children, edges: edges
      },
      texts: texts
    };
  };

  /* The ELK class, as a promise: a saved page (and the embedded V8 of graph_svg) runs elk.bundled.js before this
   * file, a notebook's page unpacks it after (page.py's ELK_LOADER sets root.fxgElk): the layout waits for it. */
  function elkClass() {
    if (root.ELK) return Promise.resolve(root.ELK);
    return root.fxgElk || Promise.reject(new Error("the layout engine (ELK) is not in the page"));
  }

  FXG.layout = function (model, open, opts) {
    var built = FXG.elkGraph(model, open, opts);
    return elkClass().then(function (ELK) {
      return new ELK().layout(built.graph);
    }).then(function (laid) { return { graph: laid, texts: built.texts, open: open }; });
  };

  /* ---------------------------------------------------------------- drawing */

  var STYLE = [
    "svg.fxg{font-family:'DejaVu Sans Mono',Menlo,Consolas,'Liberation Mono',monospace;font-size:11px}",
    ".fxg .mod>rect.box{fill:#f8f9fa;stroke:#ced4da;stroke-width:1}",
    ".fxg .mod.d1>rect.box{fill:#f1f3f5}.fxg .mod.d2>rect.box{fill:#f8f9fa}.fxg .mod.d3>rect.box{fill:#f1f3f5}",
    ".fxg .mod text.mt{font-weight:bold;fill:#495057}",
    ".fxg .node rect.box{fill:#fff;stroke:#adb5bd;stroke-width:1}",
    ".fxg .node rect.head{stroke:none}",
    ".fxg .node text.title{fill:#fff;font-weight:bold}",
    ".fxg .node text.line{fill:#343a40}",
    ".fxg .node text.reads{fill:#1c7ed6;font-style:italic}",
    ".fxg .node.collapsed rect.box{fill:#e7f5ff;stroke:#1c7ed6;stroke-width:1.5}",
    ".fxg .node.collapsed rect.box2{fill:none;stroke:#1c7ed6;stroke-width:1}",
    ".fxg .toggle{cursor:pointer}.fxg .toggle rect{fill:#fff;stroke:#868e96}.fxg .toggle text{fill:#343a40;font-weight:bold}",
    ".fxg .edge path{fill:none;stroke:#868e96;stroke-width:1.2}",
    ".fxg .edge.old path{stroke:#e03131;stroke-dasharray:4 3}",
    ".fxg .edge text{fill:#6c757d;font-size:9.5px}",
    ".fxg .edge.hl path{stroke:#1c7ed6;stroke-width:2.2}",
    ".fxg .st-removed{opacity:0.75}.fxg .st-removed rect.box{fill:#fff5f5;stroke:#e03131;stroke-width:2;stroke-dasharray:5 3}",
    ".fxg .st-removed text.line{text-decoration:line-through}",
    ".fxg .st-inserted rect.box{fill:#ebfbee;stroke:#2f9e44;stroke-width:2.5}",
    ".fxg .st-changed rect.box{fill:#fff9db;stroke:#f08c00;stroke-width:2.5}",
    ".fxg .has-changes rect.box{stroke:#f08c00;stroke-width:2.5}",
    ".fxg .div rect.box{stroke:#c92a2a;stroke-width:4}",
    ".fxg .div-ring{fill:none;stroke:#fa5252;stroke-width:2;stroke-dasharray:6 4}",
    ".fxg .sel rect.box{stroke:#1c7ed6;stroke-width:3}",
    ".fxg .match rect.box{stroke:#f59f00;stroke-width:3}",
    ".fxg .badge circle{fill:#f08c00}.fxg .badge.err circle{fill:#e03131}.fxg .badge text{fill:#fff;font-weight:bold;font-size:10px}",
    ".fxg [data-k]{cursor:pointer}"
  ].join("\n");
  FXG.STYLE = STYLE;

  function heat(share) {
    // white -> amber -> red as the share of the total time grows (a node at 10% is already hot)
    var t = Math.max(0, Math.min(1, Math.sqrt((share || 0) / 0.12)));
    var r = 255, g = Math.round(255 - t * 150), b = Math.round(255 - t * 200);
    return "rgb(" + r + "," + g + "," + b + ")";
  }
  FXG.heat = heat;

  function textLines(x, y, lines, cls) {
    var out = "";
    lines.forEach(function (l, k) { out += '<text class="' + cls + '" x="' + x + '" y="' + (y + k * LH) + '">' + esc(clip(l)) + "</text>"; });
    return out;
  }

  function drawNode(model, ix, key, box, text, opts) {
    var isMod = key[0] === "m", id = +key.slice(1), n = isMod ? null : model.nodes[id];
    var cls = ["node"], extra = "";
    var color = isMod ? COLORS.module : COLORS[n.c] || COLORS.other;
    if (isMod) {
      cls.push("collapsed");
      var st = ix.modStatus[id];
      if (st.removed || st.inserted || st.changed) cls.push("has-changes");
      if (st.div) cls.push("div");
    } else {
      if (n.st) cls.push("st-" + n.st);
      if (n.div) cls.push("div");
    }
    var x = box.x, y = box.y, w = box.width, h = box.height;
    var fill = "";
    var share = isMod ? (model.modules[id].share != null ? model.modules[id].share : ix.modShare[id]) : n.share;
    if (opts.profile && share != null) fill = ' style="fill:' + heat(share) + '"';
    var out = '<g class="' + cls.join(" ") + '" data-k="' + key + '">';
    if (isMod) out += '<rect class="box2" x="' + (x + 3) + '" y="' + (y + 3) + '" width="' + w + '" height="' + h + '" rx="4"/>';
    out += '<rect class="box" x="' + x + '" y="' + y + '" width="' + w + '" height="' + h + '" rx="4"' + fill + "/>";
    out += '<rect class="head" x="' + (x + 0.5) + '" y="' + (y + 0.5) + '" width="' + (w - 1) + '" height="' + HEAD + '" rx="3.5" fill="' + color + '"/>';
    out += '<text class="title" x="' + (x + PAD) + '" y="' + (y + 13) + '">' + esc(clip(text.title, Math.floor((w - 2 * PAD) / CW) - (isMod ? 2 : 0))) + "</text>";
    out += textLines(x + PAD, y + HEAD + 12, text.lines, "line");
    if (text.notes) out += textLines(x + PAD, y + HEAD + 12 + text.lines.length * LH, text.notes, "reads");
    if (isMod) out += toggle(x + w - 17, y + 3, "+", key);
    var lintCount = isMod ? ix.modLint[id] : (n.lint ? n.lint.length : 0);
    if (lintCount) {
      var severe = !isMod && n.lint.some(function (f) { return model.findings[f].severity !== "info"; });
      out += '<g class="badge' + (severe ? " err" : "") + '"><circle cx="' + (x + w) + '" cy="' + y + '" r="8"/><text x="' + (x + w) + '" y="' + (y + 3.5) + '" text-anchor="middle">' + lintCount + "</text></g>";
    }
    if (!isMod && n.div) out += '<rect class="div-ring" x="' + (x - 5) + '" y="' + (y - 5) + '" width="' + (w + 10) + '" height="' + (h + 10) + '" rx="7"/>';
    return out + "</g>";
  }

  function toggle(x, y, sign, key) {
    return '<g class="toggle" data-t="' + key + '"><rect x="' + x + '" y="' + y + '" width="13" height="12" rx="2"/><text x="' + (x + 6.5) + '" y="' + (y + 10) + '" text-anchor="middle">' + sign + "</text></g>";
  }

  function drawModule(model, key, box, text) {
    var id = +key.slice(1), mod = model.modules[id];
    var out = '<g class="mod d' + Math.min(mod.depth, 3) + '" data-k="' + key + '">';
    out += '<rect class="box" x="' + box.x + '" y="' + box.y + '" width="' + box.width + '" height="' + box.height + '" rx="6"/>';
    out += '<text class="mt" x="' + (box.x + 24) + '" y="' + (box.y + 15) + '">' + esc(clip(mod.path + (mod.type ? " \u00b7 " + mod.type : ""), Math.max(8, Math.floor((box.width - 30) / CW)))) + "</text>";
    out += toggle(box.x + 6, box.y + 5, "\u2212", key);
    return out + "</g>";
  }

  function edgePath(e) {
    var d = "";
    (e.sections || []).forEach(function (s) {
      d += "M" + s.startPoint.x + "," + s.startPoint.y;
      (s.bendPoints || []).forEach(function (p) { d += "L" + p.x + "," + p.y; });
      d += "L" + s.endPoint.x + "," + s.endPoint.y;
    });
    return d;
  }

  /* The SVG of a laid-out graph (a string: the page inserts it, the .svg writer saves it). */
  FXG.svg = function (model, laid, opts) {
    opts = opts || {};
    var ix = FXG.index(model), g = laid.graph, texts = laid.texts;
    var mods = "", nodes = "", edges = "";
    (function walk(container) {
      (container.children || []).forEach(function (c) {
        if (c.children && c.children.length || (c.id[0] === "m" && laid.open[+c.id.slice(1)])) {
          mods += drawModule(model, c.id, c, texts[c.id]);
          walk(c);
        } else {
          nodes += drawNode(model, ix, c.id, c, texts[c.id], opts);
        }
      });
    })(g);
    (g.edges || []).forEach(function (e) {
      var d = edgePath(e);
      if (!d) return;
      edges += '<g class="edge' + (e.old ? " old" : "") + '" data-e="' + e.sources[0] + ">" + e.targets[0] + '"><path d="' + d + '" marker-end="url(#fxg-arrow)"/>';
      (e.labels || []).forEach(function (l) {
        if (l.x != null) edges += '<text x="' + (l.x + 2) + '" y="' + (l.y + 9) + '">' + esc(l.text) + "</text>";
      });
      edges += "</g>";
    });
    var w = Math.ceil(g.width || 100), h = Math.ceil(g.height || 100);
    var defs = '<defs><marker id="fxg-arrow" viewBox="0 0 10 10" refX="9" refY="5" markerWidth="7" markerHeight="7" orient="auto-start-reverse"><path d="M0,0L10,5L0,10z" fill="#868e96"/></marker></defs>';
    var body = mods + edges + nodes;
    if (opts.inner) return { body: body, defs: defs, width: w, height: h };
    return '<svg xmlns="http://www.w3.org/2000/svg" class="fxg" width="' + w + '" height="' + h + '" viewBox="0 0 ' + w + " " + h + '">' +
      "<style>" + STYLE + "</style>" + defs + '<rect width="100%" height="100%" fill="#fff"/>' + body + "</svg>";
  };

  /* Used by fxforge's .svg writer (an embedded V8, no DOM): lay out with modules open to ``depth``. */
  FXG.renderSvg = function (modelJson, depth, profile) {
    var model = JSON.parse(modelJson);
    var open = FXG.expandedAt(model, depth == null ? model.depth : depth);
    return FXG.layout(model, open, {}).then(function (laid) { return FXG.svg(model, laid, { profile: profile }); });
  };

  root.FXG = FXG;
})(typeof window !== "undefined" ? window : globalThis);
