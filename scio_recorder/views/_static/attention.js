// Attention per head: every head as a thumbnail (click or Enter opens it),
// or one head as a labelled heat map (a window of the tokens past about 60;
// hover a query token for its row); hover, or focus and arrow keys, for a
// weight. The weights come as float32 in base64: each query's row, with only
// the keys up to its own when the pattern is causal (the others are masked).
(() => {
  const { data, root, el, fmt, heat, labelled, sequential, scale, choice, show, hide, keyed, GREY } = SV;
  const H = data.heads.length, Q = data.queries.length, K = data.keys.length;
  const raw = atob(data.weights);
  const bytes = new Uint8Array(raw.length);
  for (let b = 0; b < raw.length; b++) bytes[b] = raw.charCodeAt(b);
  const flat = new Float32Array(bytes.buffer);
  const lengths = Array.from({ length: Q }, (_, i) => (data.causal ? K - Q + i + 1 : K));
  const starts = [];
  let per = 0;
  for (const n of lengths) { starts.push(per); per += n; }
  // The weight of head number h (of those shown), query i, key j: undefined
  // when masked, null when not finite.
  function weight(h, i, j) {
    if (j >= lengths[i]) return undefined;
    const v = flat[h * per + starts[i] + j];
    return Number.isNaN(v) ? null : v;
  }

  // The colour scale, over the weights of the heads drawn.
  let mode = "linear";
  function range(hs) {
    let top = 0, low = Infinity;
    const stride = Math.max(1, Math.floor(hs.length * per / 200000));
    const sample = [];
    for (const h of hs) {
      for (let p = h * per; p < (h + 1) * per; p++) {
        const v = flat[p];
        if (!(v >= 0)) continue;
        if (v > top) top = v;
        if (v > 0 && v < low) low = v;
        if (p % stride === 0) sample.push(v);
      }
    }
    sample.sort((a, b) => a - b);
    const q99 = sample.length ? sample[Math.min(sample.length - 1, Math.floor(0.99 * sample.length))] : top;
    top = top || 1;
    return { top, low: Math.max(low === Infinity ? top / 1e4 : low, top / 1e4), q99: q99 || top };
  }
  function norm(r) {
    if (mode === "log") {
      const a = Math.log(r.low), b = Math.log(r.top);
      return { t: (v) => (v <= r.low ? 0 : (Math.log(v) - a) / (b - a || 1)), lo: r.low, hi: r.top };
    }
    const hi = mode === "quantile" ? r.q99 : r.top;
    return { t: (v) => v / hi, lo: 0, hi };
  }
  function colourer(h, t, i0, j0) {
    return (i, j) => {
      const v = weight(h, i + i0, j + j0);
      if (v === undefined) return null; // masked: hatched
      if (v === null) return GREY;
      return sequential(t(v));
    };
  }
  function text(h, i, j) {
    const v = weight(h, i, j);
    const what = v === undefined ? "masked (a key after the query)" : `weight: ${fmt(v)}`;
    return `head ${data.heads[h]}\nquery ${i}: ${data.queries[i]}\nkey ${j}: ${data.keys[j]}\n${what}`;
  }
  function rowText(h, i) {
    const row = [];
    for (let j = 0; j < lengths[i]; j++) { const w = weight(h, i, j); row.push([w === null ? -1 : w, j]); }
    row.sort((a, b) => b[0] - a[0]);
    const lines = row.slice(0, 12).map(([w, j]) => `  ${fmt(w)}  key ${j}: ${data.keys[j]}`);
    if (row.length > 12) lines.push(`  ... ${row.length - 12} more keys`);
    const masked = K - lengths[i];
    return `head ${data.heads[h]}, query ${i}: ${data.queries[i]}\nattends to:\n` + lines.join("\n") +
      (masked ? `\n(${masked} later keys masked)` : "");
  }

  const body = el("div");
  const legend = el("div");
  let current = 0;
  const CELL = 12; // the smallest cell of one head: its 11 px labels stay apart
  let q0 = 0, k0 = 0;

  function one(h) {
    const room = Math.max(120, Math.min(720, (root.clientWidth || 720) - 130));
    const fits = K * CELL <= room && Q * CELL <= 2 * room;
    const wK = fits ? K : Math.max(4, Math.floor(room / CELL));
    const wQ = fits ? Q : Math.min(Q, wK);
    q0 = Math.min(Math.max(0, q0), Q - wQ);
    k0 = Math.min(Math.max(0, k0), K - wK);
    const size = fits ? Math.max(CELL, Math.min(28, Math.floor(room / K))) : CELL;
    const n = norm(range([h]));
    const canvas = heat(wQ, wK, size, colourer(h, n.t, q0, k0), (i, j) => text(h, i + q0, j + k0), null,
      `attention of head ${data.heads[h]}, queries ${q0} to ${q0 + wQ - 1}, keys ${k0} to ${k0 + wK - 1}`);
    canvas.dataset.head = data.heads[h];
    canvas.dataset.q0 = q0;
    canvas.dataset.k0 = k0;
    const onRow = (i, event) => (i === null ? hide() : show(event, rowText(h, i + q0)));
    const grid = labelled(canvas, data.queries.slice(q0, q0 + wQ), data.keys.slice(k0, k0 + wK), size, onRow);
    grid.querySelectorAll(".sv-row").forEach((label, i) => {
      label.setAttribute("title", `${i + q0}: ${data.queries[i + q0]}`);
      keyed(label, `query ${i + q0}: ${data.queries[i + q0]}, its row`, () => rowText(h, i + q0));
    });
    grid.querySelectorAll(".sv-col").forEach((label, j) => label.setAttribute("title", `${j + k0}: ${data.keys[j + k0]}`));
    const parts = [];
    if (!fits) {
      const field = (label, value, max, set) => {
        const input = el("input", { type: "number", min: 0, max, step: Math.max(1, Math.floor(wK / 2)), value, "aria-label": label });
        input.addEventListener("change", () => { set(Number(input.value) || 0); draw(current); });
        return el("label", {}, label + " ", input);
      };
      parts.push(el("div", { class: "sv-controls sv-window" },
        field("queries from", q0, Q - wQ, (v) => { k0 += v - q0; q0 = v; }),
        field("keys from", k0, K - wK, (v) => { k0 = v; }),
        el("span", { class: "sv-note", text: `a window of ${wQ} x ${wK} of ${Q} x ${K}` })));
    }
    parts.push(el("div", { class: "sv-one" }, grid));
    legend.replaceChildren(key(n));
    return el("div", {}, ...parts);
  }

  // A head's thumbnail: at most 120 px a side (each pixel the largest weight
  // of its block of cells past 120 tokens); a click or Enter opens the head.
  function thumb(h, n) {
    const most = 120;
    const bq = Math.ceil(Q / most), bk = Math.ceil(K / most);
    const rows = Math.ceil(Q / bq), cols = Math.ceil(K / bk);
    const size = Math.max(1, Math.min(14, Math.floor(most / Math.max(rows, cols))));
    const block = (i, j) => {
      let best, any = false;
      for (let a = i * bq; a < Math.min(Q, (i + 1) * bq); a++) {
        for (let b = j * bk; b < Math.min(K, (j + 1) * bk); b++) {
          const v = weight(h, a, b);
          if (v === undefined) continue;
          any = true;
          if (v !== null && (best === undefined || v > best)) best = v;
        }
      }
      return any ? (best === undefined ? null : best) : undefined;
    };
    const colour = (i, j) => {
      const v = bq === 1 && bk === 1 ? weight(h, i, j) : block(i, j);
      return v === undefined ? null : v === null ? GREY : sequential(n.t(v));
    };
    const describe = (i, j) => {
      if (bq === 1 && bk === 1) return text(h, i, j) + "\n(click: open this head)";
      const v = block(i, j);
      return `head ${data.heads[h]}\nqueries ${i * bq}-${Math.min(Q, (i + 1) * bq) - 1}, keys ${j * bk}-${Math.min(K, (j + 1) * bk) - 1}\n` +
        (v === undefined ? "masked" : `largest weight: ${fmt(v)}`) + "\n(click: open this head)";
    };
    const canvas = heat(rows, cols, size, colour, describe, null, `head ${data.heads[h]}`);
    canvas.dataset.head = data.heads[h];
    canvas.setAttribute("tabindex", "-1"); // the thumbnail's box takes the focus
    const open = () => { picker.querySelector("select").value = String(h + 1); draw(h + 1); };
    canvas.addEventListener("click", open);
    const box = el("div", { class: "sv-head" }, el("span", { text: `head ${data.heads[h]}` }), canvas);
    keyed(box, `head ${data.heads[h]}: press Enter to open it`, null, open);
    box.setAttribute("role", "button");
    return box;
  }

  function all() {
    const n = norm(range(data.heads.map((_, h) => h)));
    legend.replaceChildren(key(n));
    const grid = el("div", { class: "sv-heads" });
    for (let h = 0; h < H; h++) grid.append(thumb(h, n));
    return grid;
  }

  function key(n) {
    const label = mode === "log"
      ? `attention weight, log scale (middle ${fmt(Math.sqrt(n.lo * n.hi))})`
      : mode === "quantile" ? "attention weight, clipped at the 99th percentile" : "attention weight";
    const hatch = el("span", { class: "sv-note" }, el("i", { class: "sv-hatch" }),
      data.causal ? " masked (keys after the query)" : "");
    const bar = scale(n.lo, n.hi, sequential, label + " (rows: queries, columns: keys)");
    if (data.causal) bar.append(hatch);
    return bar;
  }

  function draw(k) {
    current = k;
    body.replaceChildren(k === 0 ? all() : one(k - 1));
  }
  const names = ["all heads", ...data.heads.map((h) => `head ${h}`)];
  const first = H === 1 ? 1 : 0;
  const picker = choice("show", names, draw, first);
  const scales = choice("colour scale", ["linear", "log", "clipped at the 99th percentile"], (k) => {
    mode = ["linear", "log", "quantile"][k];
    draw(current);
  });
  root.append(el("div", { class: "sv-controls" }, picker, scales,
    el("span", { class: "sv-note", text: `${H} heads, ${Q} queries x ${K} keys${data.layer ? ", " + data.layer : ""}` })));
  root.append(body, legend);
  draw(first);
})();
