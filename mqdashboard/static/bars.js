// Disk bars: the page carries each percentage as data (the Content Security Policy allows no
// inline style); this sets the widths.
"use strict";
for (const bar of document.querySelectorAll(".bar span[data-pct]")) {
  const pct = Math.min(100, Math.max(0, Number(bar.dataset.pct) || 0));
  bar.style.width = pct + "%";
}
