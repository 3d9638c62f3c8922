// A small, safe Markdown subset rendered straight into DOM nodes.
//
// Supported: paragraphs, line breaks, **bold**, *italic* / _italic_, ***both***, ~~struck~~,
// `code`, ``` code blocks ```, [links](https://…), <https://…> and bare http(s) URLs (parentheses
// in them balanced, as in Wikipedia's), ![images](…) shown as links, "- " / "1. " lists,
// "# " headings, "> " quotes and "---" rules. Every piece of text becomes a text node
// (textContent), never HTML, so `<script>` or `<img onerror=…>` in a message is shown as the
// characters it is. Links keep only http:, https: and mailto: URLs; anything else (javascript:,
// data:) stays plain text.

// A link target: no spaces, parentheses only in balanced pairs (one level deep).
const TARGET = String.raw`([^()\s]*(?:\([^()\s]*\)[^()\s]*)*)`;
const INLINE = [
  { kind: "code", re: /(`{1,3})([^`\n]+?)\1(?!`)/y, text: 2 },
  { kind: "image", re: new RegExp(String.raw`!\[([^\]\n]*)\]\(` + TARGET + String.raw`\)`, "y") },
  { kind: "link", re: new RegExp(String.raw`\[([^\]\n]+)\]\(` + TARGET + String.raw`\)`, "y") },
  { kind: "autolink", re: /<((?:https?:\/\/|mailto:)[^\s<>]+)>/y },
  { kind: "both", re: /\*\*\*([^\n]+?)\*\*\*/y },
  { kind: "bold", re: /\*\*([^\n]+?)\*\*/y },
  { kind: "bold", re: /__([^\n]+?)__/y },
  { kind: "italic", re: /\*([^*\s][^*\n]*?)\*/y },
  { kind: "italic", re: /(?<![\w])_([^_\s][^_\n]*?)_(?![\w])/y },
  { kind: "struck", re: /~~([^~\n]+?)~~/y },
  { kind: "url", re: /https?:\/\/[^\s<>"'`]+/y },
];
const TRIGGERS = /[`!\[<*_~h]/g;
const TAGS = { bold: "strong", italic: "em", struck: "del" };

export function safeHref(raw) {
  try {
    const url = new URL(raw);
    return ["http:", "https:", "mailto:"].includes(url.protocol) ? url.href : null;
  } catch {
    return null;
  }
}

/** A bare URL without the punctuation that ends its sentence: a trailing ")" stays only when
 * it closes a "(" of the URL itself. */
function trimUrl(url) {
  let end = url.length;
  for (;;) {
    const last = url[end - 1];
    if (".,;:!?'\"]".includes(last)) {
      end -= 1;
    } else if (last === ")") {
      const part = url.slice(0, end);
      if (part.split("(").length >= part.split(")").length) break;
      end -= 1;
    } else {
      break;
    }
  }
  return url.slice(0, end);
}

function link(href, text) {
  const a = document.createElement("a");
  a.href = href;
  a.textContent = text;
  a.target = "_blank";
  a.rel = "noopener noreferrer nofollow";
  return a;
}

function renderInline(text, parent, depth = 0) {
  let plainStart = 0;
  let i = 0;
  const flush = (end) => {
    if (end > plainStart) parent.append(document.createTextNode(text.slice(plainStart, end)));
  };
  while (i < text.length) {
    TRIGGERS.lastIndex = i;
    const hit = TRIGGERS.exec(text);
    if (!hit) break;
    i = hit.index;
    let matched = false;
    for (const rule of INLINE) {
      rule.re.lastIndex = i;
      const m = rule.re.exec(text);
      if (!m) continue;
      let node = null;
      let length = m[0].length;
      if (rule.kind === "code") {
        node = document.createElement("code");
        node.textContent = m[rule.text];
      } else if (rule.kind === "link" || rule.kind === "image" || rule.kind === "autolink") {
        const target = rule.kind === "autolink" ? m[1] : m[2];
        const href = safeHref(target);
        const label = rule.kind === "autolink" ? target.replace(/^mailto:/, "") : m[1] || target;
        node = href ? link(href, label) : document.createTextNode(m[0]);
      } else if (rule.kind === "url") {
        const url = trimUrl(m[0]);
        const href = safeHref(url);
        node = href ? link(href, url) : document.createTextNode(url);
        length = url.length;
      } else if (depth < 4 && rule.kind === "both") {
        node = document.createElement("strong");
        const em = document.createElement("em");
        renderInline(m[1], em, depth + 1);
        node.append(em);
      } else if (depth < 4) {
        node = document.createElement(TAGS[rule.kind]);
        renderInline(m[1], node, depth + 1);
      }
      if (!node) continue;
      flush(i);
      parent.append(node);
      i += length;
      plainStart = i;
      matched = true;
      break;
    }
    if (!matched) i += 1;
  }
  flush(text.length);
}

function renderLines(lines, parent) {
  lines.forEach((line, index) => {
    if (index > 0) parent.append(document.createElement("br"));
    renderInline(line, parent);
  });
}

const FENCE = /^\s*```/;
const RULE = /^\s{0,3}([-*_])(\s*\1){2,}\s*$/;
const BULLET = /^\s*[-*+]\s+(.*)$/;
const ORDERED = /^\s*(\d{1,9})[.)]\s+(.*)$/;
const HEADING = /^\s*(#{1,6})\s+(.*)$/;
const QUOTE = /^\s*>\s?(.*)$/;

/** Render `source` into a new DocumentFragment. */
export function renderMarkdown(source) {
  const out = document.createDocumentFragment();
  const lines = String(source).replace(/\r\n?/g, "\n").split("\n");
  let i = 0;
  while (i < lines.length) {
    const line = lines[i];
    if (FENCE.test(line)) {
      const lang = line.trim().slice(3).trim();
      const body = [];
      i += 1;
      while (i < lines.length && !FENCE.test(lines[i])) body.push(lines[i++]);
      i += 1; // the closing fence (or the end)
      const pre = document.createElement("pre");
      const code = document.createElement("code");
      if (/^[\w+-]{1,20}$/.test(lang)) code.dataset.lang = lang;
      code.textContent = body.join("\n");
      pre.append(code);
      out.append(pre);
      continue;
    }
    if (!line.trim()) {
      i += 1;
      continue;
    }
    if (RULE.test(line)) {
      out.append(document.createElement("hr"));
      i += 1;
      continue;
    }
    const heading = HEADING.exec(line);
    if (heading) {
      const h = document.createElement("p");
      h.className = "md-heading";
      const strong = document.createElement("strong");
      renderInline(heading[2], strong);
      h.append(strong);
      out.append(h);
      i += 1;
      continue;
    }
    if (BULLET.test(line) || ORDERED.test(line)) {
      const ordered = !BULLET.test(line);
      const list = document.createElement(ordered ? "ol" : "ul");
      const first = ordered ? Number(ORDERED.exec(line)[1]) : 1;
      if (ordered && first !== 1) list.start = first;
      while (i < lines.length) {
        const m = ordered ? ORDERED.exec(lines[i]) : BULLET.exec(lines[i]);
        if (!m) break;
        const li = document.createElement("li");
        renderInline(ordered ? m[2] : m[1], li);
        list.append(li);
        i += 1;
      }
      out.append(list);
      continue;
    }
    if (QUOTE.test(line)) {
      const quote = document.createElement("blockquote");
      const body = [];
      while (i < lines.length && QUOTE.test(lines[i])) body.push(QUOTE.exec(lines[i++])[1]);
      renderLines(body, quote);
      out.append(quote);
      continue;
    }
    const para = [];
    while (
      i < lines.length && lines[i].trim() && !FENCE.test(lines[i]) && !HEADING.test(lines[i]) &&
      !RULE.test(lines[i]) &&
      !BULLET.test(lines[i]) && !ORDERED.test(lines[i]) && !QUOTE.test(lines[i])
    ) {
      para.push(lines[i++]);
    }
    const p = document.createElement("p");
    renderLines(para, p);
    out.append(p);
  }
  return out;
}

/** Plain text with line breaks kept: how the user's own messages are shown. */
export function renderPlain(source) {
  const out = document.createDocumentFragment();
  const p = document.createElement("p");
  p.className = "plain";
  String(source).split("\n").forEach((line, index) => {
    if (index > 0) p.append(document.createElement("br"));
    p.append(document.createTextNode(line));
  });
  out.append(p);
  return out;
}
