// Attention per head: one head as a labelled heat map (hover a query token
// for its row), or every head as small multiples; hover a cell for a weight.
(() => {
  const { data, root, el, fmt, heat, labelled, sequential, scale, choice, show, hide, cellSize } = SV;
  const H = data.weights.length, Q = data.queries.length, K = data.keys.length;
  const body = el("div");
  const colour = (h) => (i, j) => sequential(data.weights[h][i][j]);
  const text = (h) => (i, j) =>
    `head ${h}\nquery ${i}: ${data.queries[i]}\nkey ${j}: ${data.keys[j]}\nweight: ${fmt(data.weights[h][i][j])}`;

  function rowText(h, i) {
    const row = data.weights[h][i].map((w, j) => [w === null ? -1 : w, j]);
    row.sort((a, b) => b[0] - a[0]);
    const lines = row.slice(0, 12).map(([w, j]) => `  ${fmt(w)}  key ${j}: ${data.keys[j]}`);
    if (row.length > 12) lines.push(`  ... ${row.length - 12} more keys`);
    return `head ${h}, query ${i}: ${data.queries[i]}\nattends to:\n` + lines.join("\n");
  }

  function one(h) {
    const size = cellSize(K, 640, 6, 28);
    const canvas = heat(Q, K, size, colour(h), text(h));
    canvas.dataset.head = h;
    const onRow = (i, event) => (i === null ? hide() : show(event, rowText(h, i)));
    return el("div", { class: "sv-one" }, labelled(canvas, data.queries, data.keys, size, onRow));
  }

  function all() {
    const size = cellSize(K, H > 4 ? 150 : 260, 2, 14);
    const grid = el("div", { class: "sv-heads" });
    for (let h = 0; h < H; h++) {
      const canvas = heat(Q, K, size, colour(h), text(h));
      canvas.dataset.head = h;
      grid.append(el("div", { class: "sv-head" }, el("span", { text: `head ${h}` }), canvas));
    }
    return grid;
  }

  function draw(k) {
    body.replaceChildren(k === 0 ? all() : one(k - 1));
  }
  const names = ["all heads", ...Array.from({ length: H }, (_, h) => `head ${h}`)];
  const first = H === 1 ? 1 : 0;
  root.append(el("div", { class: "sv-controls" }, choice("show", names, draw, first),
    el("span", { class: "sv-note", text: `${H} heads, ${Q} queries x ${K} keys${data.layer ? ", " + data.layer : ""}` })));
  root.append(body, scale(0, 1, sequential, "attention weight (rows: queries, columns: keys)"));
  draw(first);
})();
