// A circuit: nodes by layer (columns) and head (rows), edges weighted by score.
(() => {
  const { data, root, show, hide, fmt } = SV;
  const NS = "http://www.w3.org/2000/svg";
  const dx = 200, dy = 80, pad = 50;
  const width = pad * 2 + dx * Math.max(0, data.columns - 1);
  const arc = 28 * Math.max(0, data.columns - 2);
  const height = pad * 2 + arc + dy * Math.max(0, data.rows - 1);
  const svg = document.createElementNS(NS, "svg");
  svg.setAttribute("width", width);
  svg.setAttribute("height", height);
  const x = (node) => pad + dx * node.col;
  const y = (node) => pad + arc + dy * node.row;
  const top = data.largest || 1;
  data.edges.forEach((edge, i) => {
    const a = data.nodes[edge.from], b = data.nodes[edge.to];
    const path = document.createElementNS(NS, "path");
    // edges that skip columns arc above the others, higher the more they skip
    const lift = 28 * Math.max(0, Math.abs(b.col - a.col) - 1);
    const mid = (x(a) + x(b)) / 2;
    // a head's query, key and value inputs: three curves, not one
    const letter = (edge.destination.match(/<([qkv])>$/) || [])[1];
    const bend = { q: -18, k: 0, v: 18 }[letter] || 0;
    const c1 = y(a) - lift + bend, c2 = y(b) - lift + bend;
    path.setAttribute("d", `M${x(a)},${y(a)} C${mid},${c1} ${mid},${c2} ${x(b)},${y(b)}`);
    path.setAttribute("class", "sv-edge");
    path.setAttribute("data-i", i);
    const value = edge.value === null ? 0 : edge.value;
    path.setAttribute("stroke", value >= 0 ? "#2166ac" : "#b2182b");
    path.setAttribute("stroke-width", (2 + 10 * Math.abs(value) / top).toFixed(2));
    path.addEventListener("mousemove", (event) =>
      show(event, `${edge.source} \u2192 ${edge.destination}\nscore: ${fmt(edge.value)}`));
    path.addEventListener("mouseleave", hide);
    svg.append(path);
  });
  data.nodes.forEach((node) => {
    const group = document.createElementNS(NS, "g");
    group.setAttribute("class", "sv-node");
    const circle = document.createElementNS(NS, "circle");
    circle.setAttribute("cx", x(node));
    circle.setAttribute("cy", y(node));
    circle.setAttribute("r", 10);
    const label = document.createElementNS(NS, "text");
    label.setAttribute("x", x(node));
    label.setAttribute("y", y(node) - 16);
    label.textContent = node.name;
    group.append(circle, label);
    group.addEventListener("mousemove", (event) => show(event, node.name));
    group.addEventListener("mouseleave", hide);
    svg.append(group);
  });
  root.append(svg);
})();
