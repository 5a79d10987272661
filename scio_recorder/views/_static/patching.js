// The patching grid: one cell per layer and position, hover shows the value.
// One diverging scale centred on 0 (white: zero, not the lowest value), so a
// grid of one sign reads as such and its lowest cell is not drawn white.
(() => {
  const { data, root, el, fmt, heat, labelled, scale, diverging, cellSize } = SV;
  const values = data.values;
  const rows = values.length, cols = rows ? values[0].length : 0;
  const size = cellSize(cols, 760, 10, 40);
  const bound = Math.max(Math.abs(data.low), Math.abs(data.high)) || 1;
  const colour = (v) => diverging(v === null ? null : v / bound);
  const canvas = heat(rows, cols, size, (i, j) => colour(values[i][j]), (i, j) =>
    `layer ${data.layers[i]}\nposition ${j}: ${data.positions[j]}\n${data.metric}: ${fmt(values[i][j])}`);
  root.append(labelled(canvas, data.layers, data.positions, size));
  root.append(scale(-bound, bound, (t) => diverging(2 * t - 1), `${data.metric} (white: 0)`));
})();
