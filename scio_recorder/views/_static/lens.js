// The logit lens: the top token per layer (rows) and position (columns);
// hover a cell for its top-k tokens and their probabilities.
(() => {
  const { data, root, el, fmt, sequential, css, scale, show, hide, ink } = SV;
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
      cell.style.color = ink(rgb); // the colour of more contrast (at least 4.5:1)
      const describe = () => {
        const lines = top.map(([t, q], r) => `${String(r + 1).padStart(2)}. ${fmt(q).padEnd(7)} ${JSON.stringify(t)}`);
        return `layer ${layer}, position ${j}: ${JSON.stringify(data.positions[j])}\n` + lines.join("\n");
      };
      cell.setAttribute("tabindex", i === 0 && j === 0 ? "0" : "-1");
      cell.setAttribute("aria-label", `layer ${layer}, position ${j}: top token ${token}`);
      cell.addEventListener("mousemove", (event) => show(event, describe()));
      cell.addEventListener("mouseleave", hide);
      cell.addEventListener("focus", () => {
        const box = cell.getBoundingClientRect();
        show({ clientX: box.right, clientY: box.bottom }, describe());
      });
      cell.addEventListener("blur", hide);
      row.append(cell);
    });
    body.append(row);
  });
  table.append(body);
  // One cell in the Tab order; the arrow keys move between cells.
  const MOVES = { ArrowUp: [-1, 0], ArrowDown: [1, 0], ArrowLeft: [0, -1], ArrowRight: [0, 1] };
  table.addEventListener("keydown", (event) => {
    const at = event.target.closest("td");
    if (!at || !(event.key in MOVES)) return;
    const [di, dj] = MOVES[event.key];
    const next = table.querySelector(`td[data-i="${Number(at.dataset.i) + di}"][data-j="${Number(at.dataset.j) + dj}"]`);
    if (!next) return;
    event.preventDefault();
    at.setAttribute("tabindex", "-1");
    next.setAttribute("tabindex", "0");
    next.focus();
  });
  root.append(el("div", { class: "sv-grid-wrap" }, table));
  root.append(scale(0, 1, sequential, `probability of the top token (hover: top ${data.k})`));
})();
