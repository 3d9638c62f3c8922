// A small, safe Markdown subset rendered straight into DOM nodes.
//
// Supported: paragraphs, line breaks, **bold**, *italic* / _italic_, ***both***, ~~struck~~,
// `code`, ``` code blocks ```, [links](https://…), <https://…> and bare http(s) URLs (parentheses
// in them balanced, as in Wikipedia's), ![images](…) shown as links, "- " / "1. " lists,
// "# " headings, "> " quotes and "---" rules. Every piece of text becomes a text node
// (textContent), never HTML, so `<script>` or `<img onerror=…>` in a message is shown as the
// characters it is. Links keep only http:, https: and mailto: URLs; anything else (javascript:,
// data:) stays plain text.

// Linear time, whatever the text: a reply streams in, and the page renders it again at every
// piece, so a rule that scans to the end of the line from each of its triggers (64 KiB of `[`
// or `![` took half a second a render) freezes the page. So every rule finds where it could
// end first (`find`: the next closing mark, remembered per mark, so each stretch of text is
// searched once), and its regex runs on that stretch alone. A rule's text never holds its
// closing mark, so only a few triggers share a stretch. `work.steps` counts the characters
// looked at, for the tests.
export const work = { steps: 0 };

const ENDS_AUTOLINK = /[\s<>]/g;
const ENDS_URL = /[\s<>"'`]/g;
const INLINE = [
  { kind: "code", re: /(`{1,3})([^`\n]+?)\1(?!`)/y, text: 2, until: codeEnd },
  { kind: "image" },
  { kind: "link" },
  {
    kind: "autolink",
    re: /<((?:https?:\/\/|mailto:)[^\s<>]+)>/y,
    until: (find, i, text) => {
      if (!/^<(?:https?:\/\/|mailto:)/.test(text.slice(i, i + 9))) return -1;
      const k = find(ENDS_AUTOLINK, i + 1);
      return k >= 0 && text[k] === ">" ? k + 1 : -1;
    },
  },
  { kind: "both", re: /\*\*\*([^\n]+?)\*\*\*/y, until: closedBy("***", 1) },
  { kind: "bold", re: /\*\*([^\n]+?)\*\*/y, until: closedBy("**", 1) },
  { kind: "bold", re: /__([^\n]+?)__/y, until: closedBy("__", 1) },
  { kind: "italic", re: /\*([^*\s][^*\n]*?)\*/y, until: closedBy("*", 1) },
  {
    kind: "italic",
    re: /_([^_\s][^_\n]*?)_(?![\w])/y,
    // Not inside a word (snake_case_names), before or after: one character of context each.
    until: (find, i, text) => (/\w/.test(text[i - 1] ?? "") ? -1 : underscored(find, i, text)),
  },
  { kind: "struck", re: /~~([^~\n]+?)~~/y, until: closedBy("~~", 1) },
  {
    kind: "url",
    re: /https?:\/\/[^\s<>"'`]+/y,
    until: (find, i, text) => {
      if (!/^https?:\/\//.test(text.slice(i, i + 8))) return -1;
      const k = find(ENDS_URL, i);
      return k < 0 ? text.length : k;
    },
  },
];
const TRIGGERS = /[`!\[<*_~h]/g;
const TAGS = { bold: "strong", italic: "em", struck: "del" };

/** A rule opened by `mark` at `i` and closed by the same, around at least `least` characters
 * (and `after` characters past the close, which a lookahead reads): where its stretch ends,
 * or -1. Every rule is tried at every trigger, so one whose mark is not there is out at once. */
function closedBy(mark, least, after = 0) {
  return (find, i, text) => {
    if (!text.startsWith(mark, i)) return -1;
    const close = find(mark, i + mark.length + least);
    return close < 0 ? -1 : close + mark.length + after;
  };
}
const underscored = closedBy("_", 1, 1);

/** `code` between runs of one to three backticks: its stretch ends at the next backtick
 * (code holds none), past the closing run and the character after it. */
function codeEnd(find, i, text) {
  let run = 0;
  while (run < 4 && text[i + run] === "`") run += 1;
  if (run === 0 || run > 3) return -1;
  const close = find("`", i + run);
  return close < 0 ? -1 : close + run + 1;
}

/** Where `mark` (a string, or a global regex of characters) next occurs in `text` from
 * `from`, or -1. Answers are remembered per mark: the triggers come in order, so each stretch
 * of the text is searched once per mark, however many triggers ask. */
function finder(text) {
  const known = new Map();
  return (mark, from) => {
    const last = known.get(mark);
    if (last && last[0] <= from && (last[1] < 0 || last[1] >= from)) return last[1];
    let found;
    if (typeof mark === "string") {
      found = text.indexOf(mark, from);
    } else {
      mark.lastIndex = from;
      found = mark.exec(text)?.index ?? -1;
    }
    work.steps += (found < 0 ? text.length : found) - from + 1;
    known.set(mark, [from, found]);
    return found;
  };
}

/** Where a link target that starts at `from` ends (the index of its closing `)`), or -1: no
 * spaces, parentheses only in balanced pairs, one level deep (Wikipedia's `Foo_(bar)`). */
function targetEnd(text, from) {
  let open = false;
  for (let k = from; k < text.length; k += 1) {
    work.steps += 1;
    const c = text[k];
    if (/\s/.test(c)) return -1;
    if (c === "(") {
      if (open) return -1;
      open = true;
    } else if (c === ")") {
      if (!open) return k;
      open = false;
    }
  }
  return -1;
}

/** `[label](target)` at `i` (`![label](target)` when `image`): `[whole, label, target]`, or
 * null. The label runs to the next `]`, and every `[` before that `]` shares its target, so
 * a target is read once (`targets`), not once per `[` of `[[[[…`. */
function bracketLink(text, i, image, find, targets) {
  const open = image ? i + 1 : i;
  if ((image && text[i] !== "!") || text[open] !== "[") return null;
  const close = find("]", open + 1);
  if (close < 0 || (!image && close === open + 1) || text[close + 1] !== "(") return null;
  const line = find("\n", open + 1);
  if (line >= 0 && line < close) return null;
  let end = targets.get(close);
  if (end === undefined) {
    end = targetEnd(text, close + 2);
    targets.set(close, end);
  }
  if (end < 0) return null;
  return [text.slice(i, end + 1), text.slice(open + 1, close), text.slice(close + 2, end)];
}

export function safeHref(raw) {
  try {
    const url = new URL(raw);
    return ["http:", "https:", "mailto:"].includes(url.protocol) ? url.href : null;
  } catch {
    return null;
  }
}

/** A bare URL without the punctuation that ends its sentence: a trailing ")" stays only when
 * it closes a "(" of the URL itself. Parentheses are counted once, not again at each one
 * trimmed (a URL followed by 64 KiB of `)` took a minute). */
function trimUrl(url) {
  let opened = 0;
  let closed = 0;
  for (const c of url) {
    if (c === "(") opened += 1;
    else if (c === ")") closed += 1;
  }
  work.steps += url.length;
  let end = url.length;
  while (end > 0) {
    const last = url[end - 1];
    if (".,;:!?'\"]".includes(last)) {
      end -= 1;
    } else if (last === ")" && closed > opened) {
      closed -= 1;
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

/** The match of `rule` at `i`, with its regex run on the only stretch it could match. */
function matchAt(rule, text, i, find, targets) {
  if (rule.kind === "image" || rule.kind === "link") {
    return bracketLink(text, i, rule.kind === "image", find, targets);
  }
  const end = rule.until(find, i, text);
  if (end < 0) return null;
  const stretch = text.slice(i, Math.min(end, text.length));
  work.steps += stretch.length;
  rule.re.lastIndex = 0;
  return rule.re.exec(stretch);
}

function renderInline(text, parent, depth = 0) {
  let plainStart = 0;
  let i = 0;
  const find = finder(text);
  const targets = new Map();
  const flush = (end) => {
    if (end > plainStart) parent.append(document.createTextNode(text.slice(plainStart, end)));
  };
  while (i < text.length) {
    TRIGGERS.lastIndex = i;
    const hit = TRIGGERS.exec(text);
    work.steps += (hit ? hit.index : text.length) - i + 1;
    if (!hit) break;
    i = hit.index;
    let matched = false;
    for (const rule of INLINE) {
      const m = matchAt(rule, text, i, find, targets);
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

/** Where the blocks of `text` (line ends already `\n`) that no text added after it can change
 * end: just past its last whole blank line outside a code block, at or after `from` (such an
 * end found before, or 0). Every block but a code block ends at a blank line, so rendering
 * `text.slice(0, k)` and then `text.slice(k)` builds what rendering `text` does: a reply
 * streaming in renders each finished block once, and only its last one again per piece. */
export function settledLength(text, from = 0) {
  let settled = from;
  let fenced = false;
  let start = from;
  for (let end = text.indexOf("\n", start); end >= 0; end = text.indexOf("\n", start)) {
    const line = text.slice(start, end);
    if (FENCE.test(line)) fenced = !fenced;
    else if (!fenced && !line.trim()) settled = end + 1;
    start = end + 1;
  }
  work.steps += text.length - from;
  return settled;
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
