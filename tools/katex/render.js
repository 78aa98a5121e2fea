// Render TeX formulas to HTML with KaTeX, for tools/mkdocs_katex.py.
// stdin: a JSON list of {"tex": "...", "display": true|false}.
// stdout: a JSON list, one {"html": "..."} or {"error": "..."} per formula, in order.
// throwOnError and strict "error" make every problem an error that fails the build,
// instead of red text or a console warning in the reader's browser.
const katex = require("katex");

let input = "";
process.stdin.setEncoding("utf8");
process.stdin.on("data", (chunk) => { input += chunk; });
process.stdin.on("end", () => {
  const results = JSON.parse(input).map(({ tex, display }) => {
    try {
      return { html: katex.renderToString(tex, { displayMode: display, throwOnError: true,
                                                 strict: "error", output: "htmlAndMathml" }) };
    } catch (err) {
      return { error: err.message };
    }
  });
  process.stdout.write(JSON.stringify(results));
});
