// The layer table as a tree: collapsed below `open` levels, children drawn
// when first opened (a net of thousands of modules keeps a small page).
(() => {
  const { data, root, el, show, hide, keyed } = SV;
  const rows = data.rows; // [label, name, type, call, input, output, params, recordable, reason, recorded, parent]
  const children = rows.map(() => []);
  const inside = rows.map(() => 0); // recorded rows below each row
  rows.forEach((row, i) => {
    if (row[10] >= 0) children[row[10]].push(i);
  });
  for (let i = rows.length - 1; i >= 0; i--) {
    const parent = rows[i][10];
    if (parent >= 0) inside[parent] += inside[i] + rows[i][9];
  }
  const nodes = new Map(); // row index -> its <li>, once drawn
  const counter = el("span", { class: "sv-note" });
  function count() {
    counter.textContent = `${rows.length} rows, ${data.recorded} recorded; ${nodes.size} drawn`;
  }

  function describe(i) {
    const [label, name, type, call, input, output, params, recordable, reason, recorded] = rows[i];
    const lines = [`${label}  ${name || "(the whole net)"}  ${type}`];
    lines.push(call === null ? "not a call (a container)" : `call ${call} of this module`);
    lines.push(`input  ${input}`, `output ${output}`);
    lines.push(`parameters ${params.toLocaleString("en-US")}`);
    if (recorded) lines.push("recorded");
    else if (!recordable) lines.push(`not recordable: ${reason}`);
    if (inside[i]) lines.push(`${inside[i]} recorded below`);
    return lines.join("\n");
  }

  function node(i) {
    const [label, name, type, call, , output, , recordable, , recorded] = rows[i];
    const li = el("li");
    li.dataset.label = label;
    li.dataset.recorded = recorded;
    if (!recordable) li.classList.add("sv-container");
    // the row is the control (Tab reaches it, Enter opens it); its arrow is
    // for the mouse, and a leaf has none
    const toggle = children[i].length
      ? el("button", { type: "button", class: "sv-toggle", text: "▸", tabindex: -1, "aria-hidden": "true" })
      : el("span", { class: "sv-toggle", "aria-hidden": "true" });
    const line = el("span", { class: "sv-node" },
      el("span", { class: "sv-label", text: label }),
      el("span", { text: name || "(net)" }),
      el("span", { class: "sv-type", text: type }),
      el("span", { class: "sv-shape", text: recordable ? String(output) : "" }));
    if (recorded) line.append(el("span", { class: "sv-rec", text: "recorded" }));
    if (inside[i]) line.append(el("span", { class: "sv-inside", text: `● ${inside[i]} inside` }));
    line.addEventListener("mousemove", (event) => show(event, describe(i)));
    line.addEventListener("mouseleave", hide);
    line.addEventListener("click", () => setOpen(i, !li.classList.contains("sv-open")));
    keyed(line, `${label} ${name || "(the whole net)"} ${type}${recorded ? ", recorded" : ""}` +
      (children[i].length ? `, ${children[i].length} children` : ""), () => describe(i),
    () => setOpen(i, !li.classList.contains("sv-open")));
    if (children[i].length) line.setAttribute("aria-expanded", "false");
    toggle.addEventListener("click", (event) => {
      event.stopPropagation();
      setOpen(i, !li.classList.contains("sv-open"));
    });
    li.append(toggle, line);
    nodes.set(i, li);
    return li;
  }

  function setOpen(i, open) {
    const li = nodes.get(i);
    if (!children[i].length) return;
    let list = li.querySelector(":scope > ul");
    if (open && !list) {
      list = el("ul");
      for (const c of children[i]) list.append(node(c));
      li.append(list);
      count();
    }
    if (list) list.hidden = !open;
    li.classList.toggle("sv-open", open);
    li.querySelector(":scope > .sv-node").setAttribute("aria-expanded", String(open));
    li.querySelector(":scope > .sv-toggle").textContent = open ? "▾" : "▸";
  }

  function openTo(depth, i, level) {
    if (level >= depth) return;
    setOpen(i, true);
    for (const c of children[i]) openTo(depth, c, level + 1);
  }

  function reveal(i) { // open every ancestor of row i
    const path = [];
    for (let p = rows[i][10]; p >= 0; p = rows[p][10]) path.push(p);
    for (const p of path.reverse()) setOpen(p, true);
  }

  const tree = el("ul", { class: "sv-tree" });
  const tops = rows.map((row, i) => i).filter((i) => rows[i][10] < 0);
  for (const i of tops) tree.append(node(i));
  const button = (text, action) => el("button", { type: "button", text, onclick: action });
  root.append(el("div", { class: "sv-controls" },
    button("expand all", () => rows.forEach((_, i) => setOpen(i, true))),
    button("collapse all", () => tops.forEach((i) => setOpen(i, false))),
    button("show recorded", () => rows.forEach((row, i) => row[9] && reveal(i))),
    counter));
  root.append(tree);
  for (const i of tops) openTo(data.open, i, 0);
  count();
})();
