// The patching grid: one cell per layer and position, hover shows the value.
(() => {
  const { data, root, el, fmt, heat, labelled, scale, sequential, diverging, cellSize } = SV;
  const values = data.values;
  const rows = values.length, cols = rows ? values[0].length : 0;
  const size = cellSize(cols, 760, 10, 40);
  const signed = data.low < 0 && data.high > 0;
  const bound = Math.max(Math.abs(data.low), Math.abs(data.high)) || 1;
  const span = data.high - data.low || 1;
  const colour = signed
    ? (v) => diverging(v === null ? null : v / bound)
    : (v) => sequential(v === null ? null : (v - data.low) / span);
  const canvas = heat(rows, cols, size, (i, j) => colour(values[i][j]), (i, j) =>
    `layer ${data.layers[i]}\nposition ${j}: ${data.positions[j]}\n${data.metric}: ${fmt(values[i][j])}`);
  root.append(labelled(canvas, data.layers, data.positions, size));
  root.append(signed
    ? scale(-bound, bound, (t) => diverging(2 * t - 1), data.metric)
    : scale(data.low, data.high, sequential, data.metric));
})();
