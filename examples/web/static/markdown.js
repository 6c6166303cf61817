// redlm chat page: a small Markdown renderer for what chat models write:
// ATX headings, bullet and numbered lists, fenced code blocks (with a copy
// button), inline code, links, **bold** and *italic*, paragraphs with line
// breaks. Our own rather than a library: the subset is small, and owning it
// keeps the page free of a vendored dependency.
//
// Safety: every piece of the model's text goes through esc() before it is
// part of the HTML string, so a model (or a prompt injection) that writes
// <script> or <img onerror> gets it shown as text. The only markup in the
// output is what this file emits. Links keep http(s) and mailto targets
// only (no javascript:, data:), open in a new tab with rel=noopener.
//
// It is called on the whole answer again at every delta (answers are a few
// KB; re-rendering is cheaper than being clever), so an unclosed code fence
// while streaming renders as an open code block until its closing line
// arrives.
"use strict";

const Markdown = (() => {
  const esc = (s) => s.replace(/&/g, "&amp;").replace(/</g, "&lt;").replace(/>/g, "&gt;")
    .replace(/"/g, "&quot;").replace(/'/g, "&#39;");

  function safeUrl(u) {
    u = u.trim();
    return /^(https?:\/\/|mailto:)/i.test(u) ? u : null;
  }

  // Inline spans of one block's text: code spans first (their content is
  // literal), then links, bold, italic on the escaped remainder.
  function inline(text) {
    const out = [];
    const re = /(`+)([\s\S]*?[^`])\1(?!`)/g;
    let last = 0, m;
    while ((m = re.exec(text))) {
      out.push(spans(text.slice(last, m.index)));
      out.push("<code>" + esc(m[2].replace(/^ (.*) $/s, "$1")) + "</code>");
      last = re.lastIndex;
    }
    out.push(spans(text.slice(last)));
    return out.join("");
  }

  function spans(text) {
    // links are found on the raw text so the URL is checked before escaping
    const out = [];
    const re = /\[([^\]\n]+)\]\(([^)\s]+)\)/g;
    let last = 0, m;
    while ((m = re.exec(text))) {
      out.push(emph(text.slice(last, m.index)));
      const url = safeUrl(m[2]);
      out.push(url ? `<a href="${esc(url)}" target="_blank" rel="noopener noreferrer">${emph(m[1])}</a>`
                   : emph(m[0]));
      last = re.lastIndex;
    }
    out.push(emph(text.slice(last)));
    return out.join("");
  }

  function emph(text) {
    return esc(text)
      .replace(/\*\*(?=\S)([\s\S]*?\S)\*\*/g, "<strong>$1</strong>")
      .replace(/(^|[^*\w])\*(?=\S)([^*\n]*?\S)\*(?![*\w])/g, "$1<em>$2</em>");
  }

  const fenceRe = /^ {0,3}(```+|~~~+)\s*([\w+#.-]*)\s*$/;
  const headRe = /^ {0,3}(#{1,6})\s+(.*?)\s*#*\s*$/;
  const ulRe = /^(\s*)[-*+]\s+(.*)$/;
  const olRe = /^(\s*)(\d{1,9})[.)]\s+(.*)$/;

  // Renders text to an HTML string.
  function render(text) {
    const lines = text.replace(/\r\n?/g, "\n").split("\n");
    const html = [];
    let para = [];
    const flush = () => {
      if (para.length) html.push("<p>" + para.map(inline).join("<br>") + "</p>");
      para = [];
    };
    for (let i = 0; i < lines.length;) {
      const line = lines[i];
      let m;
      if ((m = fenceRe.exec(line))) {
        flush();
        const fence = m[1], lang = m[2];
        const body = [];
        i++;
        while (i < lines.length && !(lines[i].trim().startsWith(fence[0].repeat(fence.length)) &&
                                     /^\s*(`{3,}|~{3,})\s*$/.test(lines[i]))) body.push(lines[i++]);
        const open = i >= lines.length;  // still streaming
        i++;
        html.push(`<div class="code-block${open ? " open" : ""}"><div class="code-head"><span class="lang">` +
                  esc(lang || "code") + `</span><button type="button" class="copy" title="Copy the code">Copy</button>` +
                  `</div><pre><code${lang ? ` class="language-${esc(lang)}"` : ""}>` +
                  esc(body.join("\n")) + "</code></pre></div>");
        continue;
      }
      if ((m = headRe.exec(line))) {
        flush();
        const n = m[1].length;
        html.push(`<h${n}>${inline(m[2])}</h${n}>`);
        i++;
        continue;
      }
      if (ulRe.test(line) || olRe.test(line)) {
        flush();
        i = list(lines, i, html);
        continue;
      }
      if (!line.trim()) {
        flush();
        i++;
        continue;
      }
      para.push(line);
      i++;
    }
    flush();
    return html.join("");
  }

  // One list starting at lines[i] (nested lists by indentation, two or more
  // spaces deeper); returns the index after it.
  function list(lines, i, html) {
    const first = ulRe.exec(lines[i]) || olRe.exec(lines[i]);
    const indent = first[1].length;
    const ordered = !ulRe.test(lines[i]);
    const start = ordered ? parseInt(olRe.exec(lines[i])[2], 10) : 1;
    html.push(ordered ? (start !== 1 ? `<ol start="${start}">` : "<ol>") : "<ul>");
    let item = null;
    const close = () => { if (item !== null) html.push("<li>" + item.map(inline).join("<br>") + "</li>"); item = null; };
    while (i < lines.length) {
      const line = lines[i];
      const u = ulRe.exec(line), o = olRe.exec(line);
      const mm = u || o;
      if (mm && mm[1].length === indent && !!o === ordered) {
        close();
        item = [u ? u[2] : o[3]];
        i++;
      } else if (mm && mm[1].length > indent + 1 && item !== null) {
        // a nested list belongs to the current item
        const inner = [];
        i = list(lines, i, inner);
        html.push("<li>" + item.map(inline).join("<br>") + inner.join("") + "</li>");
        item = null;
      } else if (!mm && line.trim() && item !== null && /^\s+/.test(line)) {
        item.push(line.trim());  // a continuation line
        i++;
      } else {
        break;
      }
    }
    close();
    html.push(ordered ? "</ol>" : "</ul>");
    return i;
  }

  return { render, esc };
})();
