// The logit lens: the top token per layer (rows) and position (columns);
// hover a cell for its top-k tokens and their probabilities.
(() => {
  const { data, root, el, fmt, sequential, css, scale, show, hide } = SV;
  const table = el("table", { class: "sv-grid" });
  const head = el("tr", {}, el("th", { text: "layer \\ input" }));
  data.positions.forEach((name, j) => head.append(el("th", { class: "sv-pos", text: name, title: `${j}: ${name}` })));
  table.append(el("thead", {}, head));
  const body = el("tbody");
  data.layers.forEach((layer, i) => {
    const row = el("tr", {}, el("th", { text: layer }));
    data.top[i].forEach((top, j) => {
      const [token, p] = top[0];
      const rgb = sequential(p);
      const cell = el("td", { text: token });
      cell.dataset.i = i;
      cell.dataset.j = j;
      cell.style.background = css(rgb);
      cell.style.color = p > 0.55 ? "#fff" : "#1a1a1a";
      cell.addEventListener("mousemove", (event) => {
        const lines = top.map(([t, q], r) => `${String(r + 1).padStart(2)}. ${fmt(q).padEnd(7)} ${JSON.stringify(t)}`);
        show(event, `layer ${layer}, position ${j}: ${JSON.stringify(data.positions[j])}\n` + lines.join("\n"));
      });
      cell.addEventListener("mouseleave", hide);
      row.append(cell);
    });
    body.append(row);
  });
  table.append(body);
  root.append(el("div", { class: "sv-grid-wrap" }, table));
  root.append(scale(0, 1, sequential, `probability of the top token (hover: top ${data.k})`));
})();
