"""Render a run's ``report.md`` as one self-contained ``report.html``.

``emu.report`` writes ``report.md``; this module turns it into a single HTML
file that can be mailed, attached to an issue or opened from a USB stick:
plots are inlined as base64 ``data:`` URIs, the stylesheet is embedded and
nothing is fetched from anywhere (a Content-Security-Policy says so too).
Links to the run's other files (pcaps, flows.csv, result.json) stay relative,
so they work when the HTML sits in its run folder.

The converter handles exactly the Markdown subset ``emu.report`` writes:

* ATX headings (``#`` .. ``######``), paragraphs;
* ``**bold**``, ``*italic*``, code spans in backticks, backslash escapes;
* links ``[text](url)`` and images ``![alt](url)``;
* pipe tables (header row, ``| --- |`` separator, rows; ``\\|`` is a pipe);
* fenced code blocks (three or more backticks, optional language),
  blockquotes, ``-`` and ``1.`` lists;
* ``<details><summary>...</summary>`` ... ``</details>`` on lines of their own.

Everything else is text and is HTML-escaped: raw HTML in the Markdown (or in
values that came from result.json) is shown, never interpreted.  Only
``http``, ``https`` and ``mailto`` links and scheme-less (relative) ones are
kept; images are embedded only when they are PNG, JPEG or GIF files inside the
run folder, otherwise they become a plain link.  The output is well formed by
construction: every element is closed where it is opened.
"""

from __future__ import annotations

import base64
import bisect
import html
import re
import string
import urllib.parse
from pathlib import Path
from typing import List, Optional, Tuple

MARKDOWN_FILE = "report.md"
HTML_FILE = "report.html"

# Image types embedded as data URIs: suffix -> (MIME type, leading bytes).
_IMAGE_TYPES = {
    ".png": ("image/png", (b"\x89PNG\r\n\x1a\n",)),
    ".jpg": ("image/jpeg", (b"\xff\xd8\xff",)),
    ".jpeg": ("image/jpeg", (b"\xff\xd8\xff",)),
    ".gif": ("image/gif", (b"GIF87a", b"GIF89a")),
}
_SAFE_SCHEMES = ("http", "https", "mailto")

# Guard against pathological input: deeper nesting is rendered as text.
MAX_BLOCK_DEPTH = 16
MAX_INLINE_DEPTH = 16

_PUNCTUATION = frozenset(string.punctuation)
_WHITESPACE = re.compile(r"\s")
_CONTROL = re.compile(r"[\x00-\x08\x0b\x0c\x0e-\x1f\x7f]")

_FENCE = re.compile(r"^ {0,3}(`{3,})[ \t]*([^`\s]*)[^`]*$")
_HEADING = re.compile(r"^ {0,3}(#{1,6})(?:[ \t]+(.*?))?[ \t]*$")
_DETAILS_OPEN = re.compile(r"^ {0,3}<details>[ \t]*<summary>(.*)</summary>[ \t]*$",
                           re.IGNORECASE)
_DETAILS_CLOSE = re.compile(r"^ {0,3}</details>[ \t]*$", re.IGNORECASE)
_QUOTE = re.compile(r"^ {0,3}> ?(.*)$")
_BULLET = re.compile(r"^ {0,3}[-*+][ \t]+(.*)$")
_ORDERED = re.compile(r"^ {0,3}(\d{1,9})[.)][ \t]+(.*)$")
_TABLE_SEPARATOR = re.compile(r"^ {0,3}\|?[ \t]*:?-+:?[ \t]*(\|[ \t]*:?-+:?[ \t]*)*\|?[ \t]*$")

STYLE = """
:root { color-scheme: light; --fg: #1d232a; --muted: #5b6570; --line: #d5dbe1;
  --code: #f3f5f7; --accent: #1f5fa8; --warn-bg: #fff4e0; --warn: #b25e00; }
* { box-sizing: border-box; }
body { margin: 0; color: var(--fg); background: #fff; line-height: 1.5;
  font: 15px/1.5 system-ui, -apple-system, "Segoe UI", Roboto, Helvetica, Arial, sans-serif; }
main { max-width: 72rem; margin: 0 auto; padding: 1.5rem 1.25rem 3rem; }
h1 { font-size: 1.7rem; margin: 0 0 .75rem; }
h2 { font-size: 1.3rem; margin: 2rem 0 .6rem; padding-bottom: .2rem;
  border-bottom: 1px solid var(--line); }
h3 { font-size: 1.1rem; margin: 1.4rem 0 .5rem; }
a { color: var(--accent); }
code, pre { font-family: ui-monospace, SFMono-Regular, Menlo, Consolas, monospace;
  font-size: .9em; background: var(--code); border-radius: 3px; }
code { padding: .05em .3em; }
pre { padding: .75rem 1rem; overflow-x: auto; line-height: 1.35; }
pre code { padding: 0; background: none; }
.table-wrap { overflow-x: auto; margin: .6rem 0 1rem; }
table { border-collapse: collapse; font-size: .92rem; }
th, td { border: 1px solid var(--line); padding: .3rem .6rem; text-align: left;
  vertical-align: top; }
th { background: #eef1f4; }
tbody tr:nth-child(even) { background: #f8f9fa; }
blockquote { margin: .6rem 0; padding: .5rem .9rem; background: var(--warn-bg);
  border-left: 4px solid var(--warn); border-radius: 3px; }
blockquote p { margin: .2rem 0; }
img { max-width: 100%; height: auto; border: 1px solid var(--line); }
details { margin: .6rem 0; }
summary { cursor: pointer; color: var(--accent); }
.missing-image { color: var(--warn); }
footer { margin-top: 3rem; color: var(--muted); font-size: .85rem; }
@media print { main { max-width: none; } }
""".strip()

CSP = ("default-src 'none'; img-src data:; style-src 'unsafe-inline'; "
       "base-uri 'none'; form-action 'none'")


def _escape(text: str) -> str:
    """HTML-escape text (quotes too) and replace control characters."""
    return html.escape(_CONTROL.sub("\ufffd", text), quote=True)


# Links and images ----------------------------------------------------------------

def _unescape_backslashes(text: str) -> str:
    return re.sub(r"\\([%s])" % re.escape(string.punctuation), r"\1", text)


def safe_href(url: str) -> Optional[str]:
    """``url`` if it is relative or http(s)/mailto, else None."""
    if any(ch.isspace() or ord(ch) < 32 or ord(ch) == 127 for ch in url):
        return None
    scheme = re.match(r"([A-Za-z][A-Za-z0-9+.\-]*):", url)
    if scheme and scheme.group(1).lower() not in _SAFE_SCHEMES:
        return None
    return url


def image_data_uri(url: str, run_dir: Optional[Path]) -> Optional[str]:
    """A data: URI for a PNG/JPEG/GIF inside ``run_dir`` that ``url`` names."""
    if run_dir is None or safe_href(url) is None:
        return None
    parts = urllib.parse.urlsplit(url)
    if parts.scheme or parts.netloc:
        return None
    relative = urllib.parse.unquote(parts.path)
    if not relative or relative.startswith(("/", "\\")) or "\x00" in relative:
        return None
    try:
        root = Path(run_dir).resolve()
        path = (root / relative).resolve()
    except (OSError, RuntimeError, ValueError):
        return None
    try:
        if not path.is_relative_to(root) or not path.is_file():
            return None
    except OSError:
        return None
    kind = _IMAGE_TYPES.get(path.suffix.lower())
    if kind is None:
        return None
    mime, signatures = kind
    try:
        data = path.read_bytes()
    except OSError:
        return None
    if not data.startswith(signatures):
        return None
    return f"data:{mime};base64,{base64.b64encode(data).decode('ascii')}"


# Inline Markdown -----------------------------------------------------------------

class _Spans:
    """One left-to-right pass over a text, so that no delimiter is searched twice.

    Outside backslash escapes and code spans it records where code spans end,
    the star runs that can close emphasis (they follow a non-space) and which
    ``]`` closes each ``[``; parentheses are paired for link destinations.
    """

    def __init__(self, text: str):
        self.text = text
        self.code_end: dict = {}     # opening backtick index -> closing run index
        self.closers = {(1, True): [], (2, True): [], (1, False): [], (2, False): []}
        self.bracket: dict = {}      # "[" index -> matching "]" index
        self._paren: Optional[dict] = None
        failed: dict = {}            # backtick run length -> index it failed from
        stack: List[int] = []
        i, n = 0, len(text)
        while i < n:
            char = text[i]
            if char == "\\":
                i += 2
                continue
            if char == "`":
                run = _run_length(text, i, "`")
                end = None if failed.get(run, n) <= i else _code_span_end(text, i + run, run)
                if end is None:
                    failed[run] = min(failed.get(run, n), i)
                    i += run
                else:
                    self.code_end[i] = end
                    i = end + run
                continue
            if char == "*":
                run = _run_length(text, i, "*")
                if i > 0 and not text[i - 1].isspace():
                    for width in (1, 2):
                        if run == width:
                            self.closers[width, True].append(i)
                        elif run > width:
                            # The last ``width`` stars of a longer run close.
                            self.closers[width, False].append(i + run - width)
                i += run
                continue
            if char == "[":
                stack.append(i)
            elif char == "]" and stack:
                self.bracket[stack.pop()] = i
            i += 1

    def emphasis_close(self, after: int, width: int) -> Optional[int]:
        """Index of the ``width`` stars closing emphasis whose text starts at after.

        A run of exactly ``width`` stars is preferred, else the end of a longer
        one (``**a *b***``).
        """
        for exact in (True, False):
            candidates = self.closers[width, exact]
            index = bisect.bisect_left(candidates, after)
            if index < len(candidates):
                return candidates[index]
        return None

    def paren(self, start: int) -> Optional[int]:
        """Index of the ")" balancing the "(" at ``start`` (escapes skipped)."""
        if self._paren is None:
            self._paren, stack, i, text = {}, [], 0, self.text
            while i < len(text):
                if text[i] == "\\":
                    i += 1
                elif text[i] == "(":
                    stack.append(i)
                elif text[i] == ")" and stack:
                    self._paren[stack.pop()] = i
                i += 1
        return self._paren.get(start)

    def link_at(self, start: int) -> Optional[Tuple[str, str, int]]:
        """(label, url, index after) for ``[label](url)`` at ``text[start] == "["``."""
        close = self.bracket.get(start)
        if close is None or not self.text.startswith("(", close + 1):
            return None
        end = self.paren(close + 1)
        if end is None:
            return None
        url = self.text[close + 2:end].strip()
        if _WHITESPACE.search(url):
            return None
        if url.startswith("<") and url.endswith(">"):
            url = url[1:-1]
        return self.text[start + 1:close], _unescape_backslashes(url), end + 1


class _Inline:
    """Inline spans of one block of text; every tag is closed where opened."""

    def __init__(self, run_dir: Optional[Path]):
        self.run_dir = run_dir

    def render(self, text: str, depth: int = 0, in_link: bool = False) -> str:
        if depth > MAX_INLINE_DEPTH:
            return _escape(text)
        spans = _Spans(text)
        out: List[str] = []
        i, n = 0, len(text)
        while i < n:
            char = text[i]
            if char == "\\" and i + 1 < n and text[i + 1] in _PUNCTUATION:
                out.append(_escape(text[i + 1]))
                i += 2
                continue
            if char == "`":
                run = _run_length(text, i, "`")
                end = spans.code_end.get(i)
                if end is None:
                    out.append(_escape("`" * run))
                    i += run
                    continue
                code = text[i + run:end].replace("\n", " ")
                if len(code) > 2 and code[0] == code[-1] == " " and code.strip():
                    code = code[1:-1]
                out.append(f"<code>{_escape(code)}</code>")
                i = end + run
                continue
            if char == "!" and text.startswith("[", i + 1):
                link = spans.link_at(i + 1)
                if link is not None:
                    label, url, i = link
                    out.append(self._image(label, url))
                    continue
            if char == "[" and not in_link:
                link = spans.link_at(i)
                if link is not None:
                    label, url, i = link
                    out.append(self._link(label, url, depth))
                    continue
            if char == "*":
                run = _run_length(text, i, "*")
                emphasis = self._emphasis(spans, i, run, depth, in_link)
                if emphasis is not None:
                    rendered, i = emphasis
                    out.append(rendered)
                    continue
                out.append(_escape("*" * run))
                i += run
                continue
            out.append(_escape(char))
            i += 1
        return "".join(out)

    def _emphasis(self, spans: _Spans, start: int, run: int, depth: int,
                  in_link: bool) -> Optional[Tuple[str, int]]:
        """(<strong>/<em> html, index after it) for a ``*`` run that opens one."""
        text = spans.text
        after = start + run
        if after >= len(text) or text[after].isspace():
            return None  # a "*" followed by a space opens nothing
        for width, tag in ((2, "strong"), (1, "em")):
            if run < width:
                continue
            close = spans.emphasis_close(after, width)
            if close is None:
                continue
            # The last ``width`` stars of the run open; earlier ones stay text.
            inner = self.render(text[after:close], depth + 1, in_link)
            return (_escape("*" * (run - width))
                    + f"<{tag}>{inner}</{tag}>", close + width)
        return None

    def _link(self, label: str, url: str, depth: int) -> str:
        inner = self.render(label, depth + 1, in_link=True)
        href = safe_href(url)
        if href is None:
            return inner
        return f'<a href="{_escape(href)}">{inner}</a>'

    def _image(self, alt: str, url: str) -> str:
        alt_text = _unescape_backslashes(alt)
        uri = image_data_uri(url, self.run_dir)
        if uri is not None:
            return f'<img src="{uri}" alt="{_escape(alt_text)}">'
        href = safe_href(url)
        if href is None:
            return f'<span class="missing-image">{_escape(alt_text)}</span>'
        return (f'<a class="missing-image" href="{_escape(href)}">'
                f'{_escape(alt_text)}</a> (image not embedded)')


def _run_length(text: str, start: int, char: str) -> int:
    end = start
    while end < len(text) and text[end] == char:
        end += 1
    return end - start


def _code_span_end(text: str, start: int, run: int) -> Optional[int]:
    """Index of the backtick run of exactly ``run`` that closes a code span."""
    fence = "`" * run
    position = start
    while True:
        position = text.find(fence, position)  # always the start of a run
        if position < 0:
            return None
        length = _run_length(text, position, "`")
        if length == run:
            return position
        position += length


# Block Markdown ------------------------------------------------------------------

def _split_row(line: str) -> List[str]:
    """Cells of a table row; ``\\|`` is a literal pipe (GFM rules)."""
    row = line.strip()
    if row.startswith("|"):
        row = row[1:]
    if row.endswith("|") and not row.endswith("\\|"):
        row = row[:-1]
    cells, current, i = [], [], 0
    while i < len(row):
        if row[i] == "\\" and i + 1 < len(row) and row[i + 1] == "|":
            current.append("|")
            i += 2
            continue
        if row[i] == "|":
            cells.append("".join(current).strip())
            current = []
        else:
            current.append(row[i])
        i += 1
    cells.append("".join(current).strip())
    return cells


def _alignments(separator: str) -> List[Optional[str]]:
    result = []
    for cell in _split_row(separator):
        left, right = cell.startswith(":"), cell.endswith(":")
        result.append("center" if left and right else "right" if right
                      else "left" if left else None)
    return result


def _is_table_start(lines: List[str], index: int) -> bool:
    return ("|" in lines[index] and index + 1 < len(lines)
            and "|" in lines[index + 1]
            and _TABLE_SEPARATOR.match(lines[index + 1]) is not None)


def _fence_end(lines: List[str], start: int, fence: str) -> Optional[int]:
    """Index of the line closing the fence opened at ``start``, if any."""
    for index in range(start + 1, len(lines)):
        stripped = lines[index].strip()
        if len(lines[index]) - len(lines[index].lstrip(" ")) <= 3 \
                and stripped.startswith(fence) and stripped == "`" * len(stripped):
            return index
    return None


def _pair_blocks(lines: List[str]) -> Tuple[dict, dict]:
    """({fence line: closing line}, {<details> line: </details> line}).

    One pass, outside fences: an unclosed fence or <details> is a line of
    text, so one odd value cannot swallow the rest of the report.
    """
    fences: dict = {}
    details: dict = {}
    stack: List[int] = []
    no_closer_from = None  # fences this long or longer have no closer left
    i = 0
    while i < len(lines):
        line = lines[i]
        fence = _FENCE.match(line)
        if fence:
            length = len(fence.group(1))
            end = None
            if no_closer_from is None or length < no_closer_from:
                end = _fence_end(lines, i, fence.group(1))
                if end is None:
                    no_closer_from = length
            if end is not None:
                fences[i] = end
                i = end + 1
                continue
        elif _DETAILS_OPEN.match(line):
            stack.append(i)
        elif _DETAILS_CLOSE.match(line) and stack:
            details[stack.pop()] = i
        i += 1
    return fences, details


class _Blocks:
    def __init__(self, run_dir: Optional[Path]):
        self.inline = _Inline(run_dir)
        self.ids: dict = {}
        self.title: Optional[str] = None

    def _slug(self, text: str) -> str:
        slug = re.sub(r"[^a-z0-9]+", "-", text.lower()).strip("-") or "section"
        count = self.ids.get(slug, 0)
        self.ids[slug] = count + 1
        return slug if count == 0 else f"{slug}-{count + 1}"

    def _starts_block(self, lines: List[str], index: int) -> bool:
        line = lines[index]
        return bool(_FENCE.match(line) or _HEADING.match(line)
                    or _DETAILS_OPEN.match(line) or _DETAILS_CLOSE.match(line)
                    or _QUOTE.match(line) or _BULLET.match(line)
                    or _ORDERED.match(line) or _is_table_start(lines, index))

    def render(self, lines: List[str], depth: int = 0) -> List[str]:
        out: List[str] = []
        fences, details_pairs = _pair_blocks(lines)
        i = 0
        while i < len(lines):
            line = lines[i]
            if not line.strip():
                i += 1
                continue
            if depth > MAX_BLOCK_DEPTH:
                # Too deeply nested to be anything this module writes.
                out.append(f"<p>{_escape(chr(10).join(lines[i:]).strip())}</p>")
                break
            fence = _FENCE.match(line)
            if fence and i in fences:
                end = fences[i]
                language = fence.group(2)
                attribute = (f' class="language-{_escape(language)}"'
                             if language else "")
                body = "\n".join(lines[i + 1:end])
                out.append(f"<pre><code{attribute}>{_escape(body)}</code></pre>")
                i = end + 1
                continue
            heading = _HEADING.match(line)
            if heading:
                level = len(heading.group(1))
                text = heading.group(2) or ""
                rendered = self.inline.render(text)
                plain = html.unescape(re.sub(r"<[^>]*>", "", rendered))
                if level == 1 and self.title is None:
                    self.title = plain
                out.append(f'<h{level} id="{self._slug(plain)}">{rendered}</h{level}>')
                i += 1
                continue
            details = _DETAILS_OPEN.match(line)
            end = details_pairs.get(i) if details else None
            if end is not None:
                summary = self.inline.render(details.group(1).strip())
                out.append(f"<details><summary>{summary}</summary>")
                out += self.render(lines[i + 1:end], depth + 1)
                out.append("</details>")
                i = end + 1
                continue
            if fence or details or _DETAILS_CLOSE.match(line):
                # An unclosed fence or <details>, or a stray </details>: text,
                # so that one odd value cannot swallow the rest of the report.
                out.append(f"<p>{self.inline.render(line.strip())}</p>")
                i += 1
                continue
            if _QUOTE.match(line):
                inner = []
                while i < len(lines) and _QUOTE.match(lines[i]):
                    inner.append(_QUOTE.match(lines[i]).group(1))
                    i += 1
                out.append("<blockquote>")
                out += self.render(inner, depth + 1)
                out.append("</blockquote>")
                continue
            if _BULLET.match(line) or _ORDERED.match(line):
                i = self._list(lines, i, out)
                continue
            if _is_table_start(lines, i):
                i = self._table(lines, i, out)
                continue
            paragraph = [line.strip()]
            i += 1
            while i < len(lines) and lines[i].strip() \
                    and not self._starts_block(lines, i):
                paragraph.append(lines[i].strip())
                i += 1
            out.append(f"<p>{self.inline.render(chr(10).join(paragraph))}</p>")
        return out

    def _list(self, lines: List[str], i: int, out: List[str]) -> int:
        pattern = _BULLET if _BULLET.match(lines[i]) else _ORDERED
        ordered = pattern is _ORDERED
        start = ""
        if ordered:
            first = int(_ORDERED.match(lines[i]).group(1))
            start = f' start="{first}"' if first != 1 else ""
        items: List[List[str]] = []
        while i < len(lines):
            match = pattern.match(lines[i])
            if match:
                items.append([match.group(match.lastindex)])
            elif lines[i].strip() and lines[i][:1] in (" ", "\t") \
                    and not self._starts_block(lines, i):
                items[-1].append(lines[i].strip())  # continuation line
            else:
                break
            i += 1
        tag = "ol" if ordered else "ul"
        out.append(f"<{tag}{start}>")
        for item in items:
            out.append(f"<li>{self.inline.render(chr(10).join(item))}</li>")
        out.append(f"</{tag}>")
        return i

    def _table(self, lines: List[str], i: int, out: List[str]) -> int:
        header = _split_row(lines[i])
        aligns = _alignments(lines[i + 1])
        width = len(header)
        aligns = (aligns + [None] * width)[:width]
        i += 2
        rows = []
        # Rows start with "|" (emu.report writes them so); a row that looks
        # like a separator ("| - | - |") is still a row.
        while i < len(lines) and lines[i].lstrip().startswith("|"):
            cells = _split_row(lines[i])
            rows.append((cells + [""] * width)[:width])
            i += 1

        def cell(tag: str, text: str, align: Optional[str]) -> str:
            style = f' style="text-align: {align}"' if align else ""
            return f"<{tag}{style}>{self.inline.render(text)}</{tag}>"

        out.append('<div class="table-wrap"><table>')
        if any(text for text in header):
            out.append("<thead><tr>" + "".join(
                cell("th", text, align) for text, align in zip(header, aligns))
                + "</tr></thead>")
        out.append("<tbody>")
        for row in rows:
            out.append("<tr>" + "".join(cell("td", text, align) for text, align
                                        in zip(row, aligns)) + "</tr>")
        out.append("</tbody></table></div>")
        return i


# Documents -----------------------------------------------------------------------

def render_html(markdown_text: str, run_dir: Path) -> str:
    """One self-contained HTML page for ``markdown_text`` (report.md's text).

    Images that name PNG/JPEG/GIF files inside ``run_dir`` are inlined as
    data URIs; other links stay as they are (relative to the run folder).
    """
    lines = markdown_text.replace("\r\n", "\n").replace("\r", "\n").split("\n")
    blocks = _Blocks(Path(run_dir) if run_dir is not None else None)
    body = "\n".join(blocks.render(lines))
    title = blocks.title or "Run report"
    return "\n".join([
        "<!DOCTYPE html>",
        '<html lang="en">',
        "<head>",
        '<meta charset="utf-8">',
        f'<meta http-equiv="Content-Security-Policy" content="{CSP}">',
        '<meta name="viewport" content="width=device-width, initial-scale=1">',
        f"<title>{_escape(title)}</title>",
        f"<style>\n{STYLE}\n</style>",
        "</head>",
        "<body>",
        "<main>",
        body,
        f'<footer>Rendered from <a href="{MARKDOWN_FILE}">{MARKDOWN_FILE}</a> '
        f"by emu.report_html; plots are embedded, links point to files in "
        f"the run folder.</footer>",
        "</main>",
        "</body>",
        "</html>",
        "",
    ])


def write_html(run_dir) -> Path:
    """Write ``report.html`` next to ``report.md`` in ``run_dir``; return its path."""
    run_dir = Path(run_dir)
    source = run_dir / MARKDOWN_FILE
    if not source.is_file():
        raise FileNotFoundError(f"no {MARKDOWN_FILE} in {run_dir}: write it first "
                                f"with python -m emu.report {run_dir}")
    text = source.read_text(encoding="utf-8", errors="replace")
    target = run_dir / HTML_FILE
    target.write_text(render_html(text, run_dir), encoding="utf-8")
    return target
