"use strict";
// Shared by every view: the data, the tooltip, colour scales, a canvas heat map.
const SV = (() => {
  const data = JSON.parse(document.getElementById("sv-data").textContent);
  const root = document.getElementById("sv-root");
  const tip = document.getElementById("sv-tip");

  function el(tag, attrs, ...children) {
    const node = document.createElement(tag);
    for (const [key, value] of Object.entries(attrs || {})) {
      if (key === "class") node.className = value;
      else if (key === "text") node.textContent = value;
      else if (key.startsWith("on")) node.addEventListener(key.slice(2), value);
      else node.setAttribute(key, value);
    }
    for (const child of children) {
      node.append(child);
    }
    return node;
  }

  // The tooltip is also a live region: what a keyboard focus shows is read out.
  tip.setAttribute("role", "status");
  tip.setAttribute("aria-live", "polite");

  function show(event, text) {
    tip.textContent = text;
    tip.hidden = false;
    const pad = 12;
    const w = tip.offsetWidth, h = tip.offsetHeight;
    let x = event.clientX + pad, y = event.clientY + pad;
    if (x + w > window.innerWidth) x = Math.max(0, event.clientX - pad - w);
    if (y + h > window.innerHeight) y = Math.max(0, event.clientY - pad - h);
    tip.style.left = x + "px";
    tip.style.top = y + "px";
  }

  function hide() {
    tip.hidden = true;
  }

  // A number as shown: four significant digits, "—" for a missing one.
  function fmt(value) {
    if (value === null || value === undefined) return "—";
    if (value === 0) return "0";
    const a = Math.abs(value);
    if (a >= 1e5 || a < 1e-3) return value.toExponential(3);
    return String(Number(value.toPrecision(4)));
  }

  function mix(a, b, t) {
    return a.map((x, i) => Math.round(x + (b[i] - x) * t));
  }
  const WHITE = [255, 255, 255], BLUE = [8, 48, 107], RED = [103, 0, 13];
  const GREY = [200, 200, 200];
  // sequential: 0 white -> 1 dark blue
  function sequential(t) {
    if (t === null || Number.isNaN(t)) return GREY;
    return mix(WHITE, BLUE, Math.min(1, Math.max(0, t)));
  }
  // diverging: -1 dark blue, 0 white, 1 dark red
  function diverging(t) {
    if (t === null || Number.isNaN(t)) return GREY;
    const c = Math.min(1, Math.max(-1, t));
    return c < 0 ? mix(WHITE, BLUE, -c) : mix(WHITE, RED, c);
  }
  function css(rgb) {
    return `rgb(${rgb[0]},${rgb[1]},${rgb[2]})`;
  }
  // WCAG 2 relative luminance and contrast ratio of two colours.
  function luminance(rgb) {
    const [r, g, b] = rgb.map((c) => {
      const v = c / 255;
      return v <= 0.04045 ? v / 12.92 : ((v + 0.055) / 1.055) ** 2.4;
    });
    return 0.2126 * r + 0.7152 * g + 0.0722 * b;
  }
  function contrast(a, b) {
    const [hi, lo] = [luminance(a), luminance(b)].sort((x, y) => y - x);
    return (hi + 0.05) / (lo + 0.05);
  }
  // The text colour (white or black) that reads best on `rgb`: at least 4.58:1
  // on any background (near-black, #1a1a1a, falls to 4.2:1 on a mid blue).
  function ink(rgb) {
    return contrast(rgb, WHITE) >= contrast(rgb, [0, 0, 0]) ? "#fff" : "#000";
  }
  const HATCH = [[242, 242, 242], [168, 168, 168]];

  // A heat map on a canvas: rows x cols cells of `size` px; `colour(i, j)`
  // gives a cell's [r, g, b] (`null`: a cell that is not drawn, hatched);
  // `text(i, j)` what hovering it shows. The cell size is kept on the canvas
  // (data-cell) for whoever computes positions. The canvas takes the
  // keyboard focus (named `label`): the arrow keys move a cursor from cell to
  // cell, Home and End go to a row's ends, and each cell's text is shown.
  function heat(rows, cols, size, colour, text, onCell, label) {
    const canvas = el("canvas", {
      class: "sv-heat", tabindex: 0, role: "img",
      "aria-label": (label || "heat map") + `: ${rows} x ${cols} cells; arrow keys move from cell to cell`,
    });
    canvas.width = cols * size;
    canvas.height = rows * size;
    canvas.dataset.rows = rows;
    canvas.dataset.cols = cols;
    canvas.dataset.cell = size;
    const ctx = canvas.getContext("2d");
    const image = ctx.createImageData(canvas.width, canvas.height);
    for (let i = 0; i < rows; i++) {
      for (let j = 0; j < cols; j++) {
        const drawn = colour(i, j);
        for (let y = i * size; y < (i + 1) * size; y++) {
          let p = (y * canvas.width + j * size) * 4;
          for (let x = 0; x < size; x++, p += 4) {
            const rgb = drawn || HATCH[(j * size + x + y) % 4 === 0 ? 1 : 0];
            image.data[p] = rgb[0];
            image.data[p + 1] = rgb[1];
            image.data[p + 2] = rgb[2];
            image.data[p + 3] = 255;
          }
        }
      }
    }
    ctx.putImageData(image, 0, 0);
    function cell(event) {
      const box = canvas.getBoundingClientRect();
      const j = Math.floor((event.clientX - box.left) / (box.width / cols));
      const i = Math.floor((event.clientY - box.top) / (box.height / rows));
      return i >= 0 && i < rows && j >= 0 && j < cols ? [i, j] : null;
    }
    canvas.addEventListener("mousemove", (event) => {
      const found = cell(event);
      if (found === null) return hide();
      show(event, text(found[0], found[1]));
      if (onCell) onCell(found[0], found[1]);
    });
    canvas.addEventListener("mouseleave", () => {
      hide();
      if (onCell) onCell(null, null);
    });
    let at = null; // the keyboard's cell
    function focus(i, j) {
      at = [Math.min(rows - 1, Math.max(0, i)), Math.min(cols - 1, Math.max(0, j))];
      const box = canvas.getBoundingClientRect();
      const w = box.width / cols, h = box.height / rows;
      canvas.dataset.at = at.join(",");
      show({ clientX: box.left + (at[1] + 1) * w, clientY: box.top + (at[0] + 1) * h }, text(at[0], at[1]));
      if (onCell) onCell(at[0], at[1]);
    }
    const MOVES = { ArrowUp: [-1, 0], ArrowDown: [1, 0], ArrowLeft: [0, -1], ArrowRight: [0, 1] };
    canvas.addEventListener("keydown", (event) => {
      const [i, j] = at || [0, 0];
      if (event.key in MOVES) {
        const [di, dj] = MOVES[event.key];
        focus(at ? i + di : 0, at ? j + dj : 0);
      } else if (event.key === "Home") focus(i, 0);
      else if (event.key === "End") focus(i, cols - 1);
      else if (event.key === "Escape") { hide(); return; }
      else return;
      event.preventDefault();
    });
    // focused by the keyboard (not by a click, which the mouse handlers serve)
    canvas.addEventListener("focus", () => canvas.matches(":focus-visible") && focus(...(at || [0, 0])));
    canvas.addEventListener("blur", () => {
      hide();
      if (onCell) onCell(null, null);
    });
    return canvas;
  }

  // Make `node` reachable by keyboard: focusable, named `label`, showing
  // `describe()` in the tooltip when focused; Enter and Space call `activate`.
  function keyed(node, label, describe, activate) {
    node.setAttribute("tabindex", "0");
    node.setAttribute("aria-label", label);
    node.addEventListener("focus", () => {
      if (!describe || !node.matches(":focus-visible")) return;
      const box = node.getBoundingClientRect();
      show({ clientX: box.right, clientY: box.bottom }, describe());
    });
    node.addEventListener("blur", hide);
    if (activate) {
      node.addEventListener("keydown", (event) => {
        if (event.key !== "Enter" && event.key !== " ") return;
        event.preventDefault();
        activate(event);
      });
    }
    return node;
  }

  // A colour bar from `low` to `high` with its end values.
  function scale(low, high, colour, label) {
    const bar = el("canvas", { width: 160, height: 10 });
    const ctx = bar.getContext("2d");
    for (let x = 0; x < 160; x++) {
      ctx.fillStyle = css(colour(x / 159));
      ctx.fillRect(x, 0, 1, 10);
    }
    return el("div", { class: "sv-scale" }, el("span", { text: fmt(low) }), bar,
      el("span", { text: fmt(high) }), el("span", { class: "sv-note", text: label }));
  }

  // A <select> of `names`; `change(index)` is called on each choice.
  function choice(label, names, change, first) {
    const select = el("select", { "aria-label": label });
    names.forEach((name, k) => select.append(el("option", { value: k, text: name })));
    select.value = String(first || 0);
    select.addEventListener("change", () => change(Number(select.value)));
    return el("label", {}, label + " ", select);
  }

  // A heat map with its row names on the left and column names above
  // (vertical); `onRow(i, event)` is called when a row name is hovered.
  function labelled(canvas, rowNames, colNames, size, onRow) {
    const box = el("div", { class: "sv-labelled" });
    box.style.gridTemplateColumns = `auto ${canvas.width}px`;
    const cols = el("div", { class: "sv-cols" });
    colNames.forEach((name, j) => {
      const label = el("span", { class: "sv-col", text: name, title: `${j}: ${name}` });
      label.style.width = size + "px";
      cols.append(label);
    });
    const rows = el("div", { class: "sv-rows" });
    rowNames.forEach((name, i) => {
      const label = el("span", { class: "sv-row", text: name, title: `${i}: ${name}` });
      label.style.height = size + "px";
      label.style.lineHeight = size + "px";
      label.dataset.row = i;
      if (onRow) {
        label.addEventListener("mouseenter", (event) => onRow(i, event));
        label.addEventListener("mouseleave", () => onRow(null, null));
      }
      rows.append(label);
    });
    box.append(el("span"), cols, rows, canvas);
    return box;
  }

  // The cell size that fits `cols` columns in about `width` pixels.
  function cellSize(cols, width, low, high) {
    return Math.max(low, Math.min(high, Math.floor(width / Math.max(1, cols))));
  }

  return {
    data, root, tip, el, show, hide, fmt, sequential, diverging, css, heat, scale,
    choice, labelled, cellSize, luminance, contrast, ink, keyed, mix, WHITE, BLUE, RED, GREY,
    HATCH,
  };
})();
