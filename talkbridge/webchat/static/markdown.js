// A small, safe Markdown subset rendered straight into DOM nodes.
//
// Supported: paragraphs, line breaks, **bold**, *italic* / _italic_, `code`, ``` code blocks ```,
// [links](https://…) and bare http(s) URLs, "- " / "1. " lists, "# " headings and "> " quotes.
// Every piece of text becomes a text node (textContent), never HTML, so `<script>` or
// `<img onerror=…>` in a message is shown as the characters it is. Links keep only http: and
// https: URLs; anything else (javascript:, data:) stays plain text.

const INLINE = [
  { kind: "code", re: /`([^`\n]+)`/y },
  { kind: "link", re: /\[([^\]\n]+)\]\(([^)\s]+)\)/y },
  { kind: "bold", re: /\*\*([^\n]+?)\*\*/y },
  { kind: "bold", re: /__([^\n]+?)__/y },
  { kind: "italic", re: /\*([^*\s][^*\n]*?)\*/y },
  { kind: "italic", re: /(?<![\w])_([^_\s][^_\n]*?)_(?![\w])/y },
  { kind: "url", re: /https?:\/\/[^\s<>"'`]+[^\s<>"'`.,;:!?)\]]/y },
];
const TRIGGERS = /[`[*_h]/g;

export function safeHref(raw) {
  try {
    const url = new URL(raw);
    return url.protocol === "http:" || url.protocol === "https:" ? url.href : null;
  } catch {
    return null;
  }
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
      if (rule.kind === "code") {
        node = document.createElement("code");
        node.textContent = m[1];
      } else if (rule.kind === "link") {
        const href = safeHref(m[2]);
        if (href) {
          node = link(href, m[1]);
        } else {
          node = document.createTextNode(m[0]);
        }
      } else if (rule.kind === "url") {
        const href = safeHref(m[0]);
        node = href ? link(href, m[0]) : document.createTextNode(m[0]);
      } else if (depth < 4) {
        node = document.createElement(rule.kind === "bold" ? "strong" : "em");
        renderInline(m[1], node, depth + 1);
      }
      if (!node) continue;
      flush(i);
      parent.append(node);
      i += m[0].length;
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
