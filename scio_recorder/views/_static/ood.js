// OoD results: a detector (and an OoD set) picked from a list; the score
// histograms of in-distribution and OoD data, and the ROC curve.
(() => {
  const { data, root, el, fmt, choice, show, hide } = SV;
  const NS = "http://www.w3.org/2000/svg";
  function svg(tag, attrs, ...children) {
    const node = document.createElementNS(NS, tag);
    for (const [k, v] of Object.entries(attrs || {})) {
      if (k === "class") node.setAttribute("class", v);
      else node.setAttribute(k, v);
    }
    children.forEach((c) => node.append(c));
    return node;
  }
  const text = (x, y, s, attrs) => svg("text", { x, y, ...attrs }, s);
  let set = 0, detector = 0;
  const panels = el("div", { class: "sv-panels" });
  const metrics = el("div", { class: "sv-metrics" });

  // An edge with the digits that tell it from its neighbours: four
  // significant ones (fmt) say 3.000e+5 for every edge of bins 0.05 wide at
  // 3e5; three more than the edge's size over the bin's width say 300000.05.
  function edge(value, width) {
    const a = Math.abs(value);
    if (value === null || value === undefined || !(width > 0) || a === 0) return fmt(value);
    const digits = Math.ceil(Math.log10(Math.max(a, width) / width)) + 3;
    if (digits <= 4) return fmt(value);
    const kept = Number(value.toPrecision(Math.min(digits, 17)));
    return a >= 1e15 ? kept.toExponential() : String(kept);
  }

  function pct(n, total) {
    return total ? ` (${(100 * n / total).toFixed(1)}%)` : "";
  }

  function histogram(p, s) {
    const W = 440, H = 200, L = 8, B = 34;
    const edges = p.edges, bins = edges.length - 1;
    const width = (edges[bins] - edges[0]) / bins;
    const nId = s.n_id, nOod = s.n_ood;
    const share = (c, n) => (n ? c / n : 0);
    let top = 0;
    for (let b = 0; b < bins; b++) top = Math.max(top, share(p.id[b], nId), share(p.ood[b], nOod));
    top = top || 1;
    const w = (W - L) / bins;
    const plot = svg("svg", { class: "sv-plot", width: W, height: H + B, viewBox: `0 0 ${W} ${H + B}` });
    for (let b = 0; b < bins; b++) {
      const x = L + b * w;
      for (const [counts, n, cls] of [[p.id, nId, "sv-id"], [p.ood, nOod, "sv-ood"]]) {
        const h = (H - 4) * share(counts[b], n) / top;
        plot.append(svg("rect", { class: cls, x, y: H - h, width: Math.max(1, w - 1), height: h }));
      }
    }
    const describe = (b) => {
      const low = b === 0 && p.clipped ? "≤ " : "";
      const high = b === bins - 1 && p.clipped ? " (and above)" : "";
      return `bin ${b}: ${low}[${edge(edges[b], width)}, ${edge(edges[b + 1], width)}${b === bins - 1 ? "]" : ")"}${high}\n` +
        `in-distribution ${p.id[b]}${pct(p.id[b], nId)}\n${s.name} ${p.ood[b]}${pct(p.ood[b], nOod)}`;
    };
    const hits = [];
    for (let b = 0; b < bins; b++) {
      const hit = svg("rect", { class: "sv-bin", x: L + b * w, y: 0, width: w, height: H });
      hit.dataset.bin = b;
      hit.addEventListener("mousemove", (event) => show(event, describe(b)));
      hit.addEventListener("mouseleave", hide);
      hits.push(hit);
      plot.append(hit);
    }
    // by keyboard: the plot takes the focus; the arrow keys move from bin to bin
    let at = 0;
    const focusBin = (b) => {
      hits[at].classList.remove("sv-at");
      at = Math.min(bins - 1, Math.max(0, b));
      hits[at].classList.add("sv-at");
      const box = hits[at].getBoundingClientRect();
      show({ clientX: box.right, clientY: box.top + box.height / 2 }, describe(at));
    };
    steps(plot, `score histograms of in-distribution and ${s.name} data, ${bins} bins; arrow keys move from bin to bin`,
      () => focusBin(at), (d) => focusBin(at + d), () => hits[at].classList.remove("sv-at"));
    plot.append(svg("line", { class: "sv-axis", x1: L, y1: H, x2: W, y2: H }));
    plot.append(text(L, H + 14, edge(edges[0], width)), text(W, H + 14, edge(edges[bins], width), { "text-anchor": "end" }));
    plot.append(text((L + W) / 2, H + 28, p.clipped
      ? `score (higher: more OoD), tails clipped to the ${data.clip[0]}-${data.clip[1]} quantiles`
      : "score (higher: more OoD)", { "text-anchor": "middle" }));
    const legend = el("div", { class: "sv-legend" },
      el("span", {}, el("i", { style: "background:#1f77b4" }), `in-distribution (${nId})`),
      el("span", {}, el("i", { style: "background:#ff7f0e" }), `${s.name} (${nOod})`));
    return el("div", { class: "sv-panel sv-histogram" }, el("h2", { text: "Scores" }), legend, plot);
  }

  // `node` in the Tab order, named `label`; Left/Right call `move(-1 | 1)`
  // (Home/End: a long way), `enter()` on focus, `leave()` on blur.
  function steps(node, label, enter, move, leave) {
    node.setAttribute("tabindex", "0");
    node.setAttribute("role", "img");
    node.setAttribute("aria-label", label);
    node.addEventListener("focus", enter);
    node.addEventListener("blur", () => { hide(); leave(); });
    node.addEventListener("keydown", (event) => {
      const d = { ArrowLeft: -1, ArrowRight: 1, ArrowDown: -1, ArrowUp: 1, Home: -1e9, End: 1e9 }[event.key];
      if (d === undefined) return;
      event.preventDefault();
      move(d);
    });
  }

  function roc(p, s) {
    const S = 220, M = 30;
    const [fpr, tpr] = p.roc;
    const plot = svg("svg", { class: "sv-plot", width: S + M, height: S + M, viewBox: `${-M} 0 ${S + M} ${S + M}` });
    const X = (v) => v * S, Y = (v) => S - v * S;
    plot.append(svg("line", { class: "sv-chance", x1: 0, y1: S, x2: S, y2: 0 }));
    plot.append(svg("polyline", { class: "sv-curve", points: fpr.map((f, k) => `${X(f)},${Y(tpr[k])}`).join(" ") }));
    plot.append(svg("rect", { x: 0, y: 0, width: S, height: S, fill: "none", class: "sv-axis" }));
    plot.append(text(S / 2, S + 14, "false positive rate (ID flagged)", { "text-anchor": "middle" }));
    plot.append(text(-8, S / 2, "true positive rate", { "text-anchor": "middle", transform: `rotate(-90 -8 ${S / 2})` }));
    const dot = svg("circle", { r: 4, fill: "#d62728", visibility: "hidden" });
    const hit = svg("rect", { class: "sv-bin sv-roc-hit", x: 0, y: 0, width: S, height: S });
    let at = 0;
    const point = (best, event) => {
      at = Math.min(fpr.length - 1, Math.max(0, best));
      dot.setAttribute("cx", X(fpr[at]));
      dot.setAttribute("cy", Y(tpr[at]));
      dot.setAttribute("visibility", "visible");
      if (!event) {
        const box = dot.getBoundingClientRect();
        event = { clientX: box.right, clientY: box.bottom };
      }
      show(event, `FPR ${fmt(fpr[at])}\nTPR ${fmt(tpr[at])}\n(${s.name} positive)`);
    };
    hit.addEventListener("mousemove", (event) => {
      const box = hit.getBoundingClientRect();
      const f = (event.clientX - box.left) / box.width;
      let best = 0;
      for (let k = 1; k < fpr.length; k++) if (Math.abs(fpr[k] - f) < Math.abs(fpr[best] - f)) best = k;
      point(best, event);
    });
    hit.addEventListener("mouseleave", () => { hide(); dot.setAttribute("visibility", "hidden"); });
    steps(plot, `ROC curve, AUROC ${fmt(p.metrics.AUROC)}, ${fpr.length} points; arrow keys move along it`,
      () => point(at), (d) => point(at + d), () => dot.setAttribute("visibility", "hidden"));
    plot.append(dot, hit);
    return el("div", { class: "sv-panel sv-roc" }, el("h2", { text: `ROC, AUROC ${fmt(p.metrics.AUROC)}` }), plot);
  }

  function draw() {
    const s = data.sets[set], p = s.panels[detector];
    panels.replaceChildren(histogram(p, s), roc(p, s));
    metrics.textContent = Object.entries(p.metrics).map(([k, v]) => `${k} ${fmt(v)}`).join("   ");
  }
  // each detector named with its AUROC on the OoD set picked (kept in step)
  const named = () => data.detectors.map((d, k) => `${d} (AUROC ${fmt(data.sets[set].panels[k].metrics.AUROC)})`);
  const picker = choice("detector", named(), (k) => { detector = k; draw(); });
  const controls = el("div", { class: "sv-controls" }, picker);
  if (data.sets.length > 1) {
    controls.append(choice("OoD set", data.sets.map((s) => s.name), (k) => {
      set = k;
      const options = picker.querySelector("select").options;
      named().forEach((name, d) => { options[d].textContent = name; });
      draw();
    }));
  }
  root.append(controls, metrics, panels);
  draw();
})();
