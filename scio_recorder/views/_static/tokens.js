"use strict";
// The token view: the text once per score, each token shaded by its score;
// hovering a token shows its value. Self-contained: reads #sv-data, uses #sv-tip.
(() => {
  const spec = JSON.parse(document.getElementById("sv-data").textContent);
  const host = document.getElementById("sv-root");
  const tipBox = document.getElementById("sv-tip");

  function number(value) {
    if (value === null || value === undefined) return "no score";
    return Number(value).toPrecision(4);
  }

  function place(event) {
    const pad = 12;
    const w = tipBox.offsetWidth, h = tipBox.offsetHeight;
    let x = event.clientX + pad, y = event.clientY + pad;
    if (x + w > window.innerWidth) x = Math.max(0, event.clientX - pad - w);
    if (y + h > window.innerHeight) y = Math.max(0, event.clientY - pad - h);
    tipBox.style.left = x + "px";
    tipBox.style.top = y + "px";
  }

  const panels = document.createElement("div");
  panels.className = "sv-token-panels";
  spec.scores.forEach((score, k) => {
    const panel = document.createElement("div");
    panel.className = "sv-token-panel";
    panel.dataset.score = String(k);
    const head = document.createElement("h2");
    head.textContent = score.name;
    const scale = document.createElement("div");
    scale.className = "sv-token-scale";
    scale.textContent = "white " + number(score.low) + " \u2192 red " + number(score.high);
    const text = document.createElement("p");
    text.className = "sv-token-text";
    const span = score.high - score.low;
    spec.tokens.forEach((token, i) => {
      const value = score.values[i];
      const node = document.createElement("span");
      node.className = "sv-token" + (value === null ? " sv-missing" : "");
      node.dataset.index = String(i);
      node.textContent = token;
      if (value !== null) {
        const level = span > 0 ? Math.min(1, Math.max(0, (value - score.low) / span)) : 0;
        node.style.backgroundColor = "rgba(214, 39, 40, " + (0.85 * level).toFixed(3) + ")";
      }
      node.addEventListener("mousemove", (event) => {
        tipBox.textContent =
          score.name + "\ntoken " + i + ": " + JSON.stringify(token) + "\nscore: " + number(value);
        tipBox.hidden = false;
        place(event);
      });
      node.addEventListener("mouseleave", () => { tipBox.hidden = true; });
      text.append(node);
    });
    panel.append(head, scale, text);
    panels.append(panel);
  });
  host.append(panels);
})();
