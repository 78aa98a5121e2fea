// MathJax 2 reads this before it loads: typeset the \( \) and \[ \] that
// pymdownx.arithmatex (generic mode) leaves inside span/div.arithmatex.
window.MathJax = {
  tex2jax: { inlineMath: [["\\(", "\\)"]], displayMath: [["\\[", "\\]"]], processEscapes: true,
             processClass: "arithmatex", ignoreClass: ".*" },
  "HTML-CSS": { fonts: ["TeX"] },
};
