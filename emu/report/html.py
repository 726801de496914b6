"""Render a run's ``report.md`` as one self-contained ``report.html``.

``emu.report.markdown`` writes ``report.md``; this module turns it into a
single HTML file that can be mailed, attached to an issue or opened from a USB
stick: plots are inlined as base64 ``data:`` URIs, the stylesheet is embedded
and nothing is fetched from anywhere (a Content-Security-Policy says so too).
Links to the run's other files (pcaps, flows.csv, result.json) stay relative,
so they work when the HTML sits in its run folder.

The Markdown is parsed by markdown-it-py (CommonMark) with GFM tables, and
with raw HTML off: any HTML in the Markdown, or in values that came from
result.json, is shown as text, never interpreted.  The Markdown itself is
not second-guessed: that no value from result.json can open a block that
swallows the page is ``emu.report.markdown``'s to ensure.  On top of CommonMark:

* only ``http``, ``https`` and ``mailto`` links and scheme-less (relative)
  ones are kept; any other link (``javascript:``, ``data:`` ...) is reduced to
  its text;
* an image is inlined only when it is a PNG, JPEG, GIF or SVG file inside the
  run folder (after resolving symbolic links) whose bytes match its type;
  otherwise it becomes a plain link, or its alt text when the link is unsafe;
* headings get ``id`` anchors, and the first ``#`` heading is the page title;
* the code block of the ``## Resolved configuration`` section is folded
  (``<details>``), found in markdown-it's token stream: it can be long.
"""

from __future__ import annotations

import base64
import re
import urllib.parse
from pathlib import Path
from typing import Callable, Dict, List, Optional, Sequence, Tuple

from markdown_it import MarkdownIt
from markdown_it.common.utils import escapeHtml
from markdown_it.rules_core import StateCore
from markdown_it.token import Token

MARKDOWN_FILE = "report.md"
HTML_FILE = "report.html"
# The heading (level 2) of report.md's last section, whose code block is folded.
CONFIG_SECTION = "Resolved configuration"


def _starts_with(*signatures: bytes) -> Callable[[bytes], bool]:
    return lambda data: data.startswith(signatures)


def _is_svg(data: bytes) -> bool:
    head = data[:4096].lstrip(b"\xef\xbb\xbf \t\r\n").lower()
    return head.startswith((b"<svg", b"<?xml", b"<!--", b"<!doctype svg")) and b"<svg" in head


# Image types inlined as data URIs: suffix -> (MIME type, test of the file's bytes).
_IMAGE_TYPES: Dict[str, Tuple[str, Callable[[bytes], bool]]] = {
    ".png": ("image/png", _starts_with(b"\x89PNG\r\n\x1a\n")),
    ".jpg": ("image/jpeg", _starts_with(b"\xff\xd8\xff")),
    ".jpeg": ("image/jpeg", _starts_with(b"\xff\xd8\xff")),
    ".gif": ("image/gif", _starts_with(b"GIF87a", b"GIF89a")),
    ".svg": ("image/svg+xml", _is_svg),
}
_SAFE_SCHEMES = ("http", "https", "mailto")
_SCHEME = re.compile(r"([A-Za-z][A-Za-z0-9+.\-]*):")

# Deeper nesting (quotes in lists in quotes ...) is left unparsed: no report
# writes it, and it bounds the work an odd report.md can cause.
MAX_NESTING = 20


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


# Links and images ----------------------------------------------------------------

def safe_href(url: str) -> Optional[str]:
    """``url`` if it is relative or http(s)/mailto, else None."""
    if any(ch.isspace() or ord(ch) < 32 or ord(ch) == 127 for ch in url):
        return None
    scheme = _SCHEME.match(url)
    if scheme and scheme.group(1).lower() not in _SAFE_SCHEMES:
        return None
    return url


def image_data_uri(url: str, run_dir: Optional[Path]) -> Optional[str]:
    """A data: URI for the PNG/JPEG/GIF/SVG file inside ``run_dir`` that ``url`` names.

    None for anything else: a remote URL, an absolute path, a path (or a
    symbolic link) leading out of the run folder, another type of file, or
    bytes that are not what the suffix says.  Nothing outside ``run_dir`` is read.
    """
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
        if not path.is_relative_to(root) or not path.is_file():
            return None
    except (OSError, RuntimeError, ValueError):
        return None
    kind = _IMAGE_TYPES.get(path.suffix.lower())
    if kind is None:
        return None
    mime, matches = kind
    try:
        data = path.read_bytes()
    except OSError:
        return None
    if not matches(data):
        return None
    return f"data:{mime};base64,{base64.b64encode(data).decode('ascii')}"


class _Markdown(MarkdownIt):
    """markdown-it that accepts every link while parsing; `_drop_unsafe_links` judges.

    markdown-it's own check leaves a refused link as literal Markdown
    (``[text](javascript:...)``); dropping the link afterwards keeps its text
    only, and one rule (`safe_href`) decides for links and images alike.
    """

    def validateLink(self, url: str) -> bool:
        return True


# Core rules --------------------------------------------------------------------

def _drop_unsafe_links(state: StateCore) -> None:
    """Reduce links with an unsafe href to their text (links never nest)."""
    for token in state.tokens:
        if token.type != "inline" or not token.children:
            continue
        kept: List[Token] = []
        dropping = False
        for child in token.children:
            if child.type == "link_open" and safe_href(str(child.attrGet("href") or "")) is None:
                dropping = True
            elif child.type == "link_close" and dropping:
                dropping = False
            else:
                kept.append(child)
        token.children = kept


def _text_of(tokens: Sequence[Token]) -> str:
    parts = []
    for token in tokens:
        if token.type in ("text", "code_inline", "text_special"):
            parts.append(token.content)
        elif token.type in ("softbreak", "hardbreak"):
            parts.append(" ")
        elif token.children:
            parts.append(_text_of(token.children))
    return "".join(parts)


def _heading_ids(state: StateCore) -> None:
    """``id`` anchors from the heading text; the first ``#`` heading titles the page."""
    used: Dict[str, int] = {}
    for index, token in enumerate(state.tokens):
        if token.type != "heading_open":
            continue
        text = _text_of(state.tokens[index + 1].children or [])
        slug = re.sub(r"[^a-z0-9]+", "-", text.lower()).strip("-") or "section"
        used[slug] = used.get(slug, 0) + 1
        token.attrSet("id", slug if used[slug] == 1 else f"{slug}-{used[slug]}")
        if token.tag == "h1":
            state.env.setdefault("title", text)


def _drop_empty_table_heads(state: StateCore) -> None:
    """A table whose header cells are all empty (``|  |  |``) gets no header row."""
    tokens, index = state.tokens, 0
    while index < len(tokens):
        if tokens[index].type == "thead_open":
            end = next(i for i in range(index, len(tokens)) if tokens[i].type == "thead_close")
            if not any(t.content.strip() for t in tokens[index:end] if t.type == "inline"):
                del tokens[index:end + 1]
                continue
        index += 1


def _fold_configuration(state: StateCore) -> None:
    """Put the configuration section's first top-level code block in a ``<details>``.

    The section is the last ``## Resolved configuration`` (report.md writes it
    last); its heading and sentence stay outside the fold, so they still show.
    """
    tokens = state.tokens
    starts = [i for i, t in enumerate(tokens) if t.type == "heading_open" and t.tag == "h2"
              and tokens[i + 1].content == CONFIG_SECTION]
    # After heading_open, its inline text and heading_close.
    for index in range(starts[-1] + 3 if starts else len(tokens), len(tokens)):
        if tokens[index].type == "heading_open":
            return                      # the section has ended without a code block
        if tokens[index].type == "fence" and tokens[index].level == 0:
            tokens[index:index + 1] = [Token("config_fold_open", "details", 1), tokens[index],
                                       Token("config_fold_close", "details", -1)]
            return


# Rendering ---------------------------------------------------------------------

def _fixed(html: str):
    return lambda self, tokens, index, options, env: html


def _image(self, tokens: Sequence[Token], index: int, options, env) -> str:
    token = tokens[index]
    url = str(token.attrGet("src") or "")
    alt = escapeHtml(self.renderInlineAsText(token.children or [], options, env))
    uri = image_data_uri(url, env.get("run_dir"))
    if uri is not None:
        return f'<img src="{uri}" alt="{alt}">'
    href = safe_href(url)
    if href is None:
        return f'<span class="missing-image">{alt}</span>'
    return (f'<a class="missing-image" href="{escapeHtml(href)}">{alt}</a> '
            f"(image not embedded)")


def _parser() -> MarkdownIt:
    md = _Markdown("commonmark", {"html": False, "xhtmlOut": False,
                                  "maxNesting": MAX_NESTING}).enable("table")
    md.core.ruler.after("inline", "drop_unsafe_links", _drop_unsafe_links)
    md.core.ruler.push("heading_ids", _heading_ids)
    md.core.ruler.push("drop_empty_table_heads", _drop_empty_table_heads)
    md.core.ruler.push("fold_configuration", _fold_configuration)
    for name, html in (("table_open", '<div class="table-wrap"><table>\n'),
                       ("table_close", "</table></div>\n"),
                       ("config_fold_open", "<details>\n<summary>Show the configuration "
                                            "(JSON)</summary>\n"),
                       ("config_fold_close", "</details>\n")):
        md.add_render_rule(name, _fixed(html))
    md.add_render_rule("image", _image)
    return md


_PARSER = _parser()


# Documents -----------------------------------------------------------------------

def render_html(markdown_text: str, run_dir: Optional[Path]) -> str:
    """One self-contained HTML page for ``markdown_text`` (report.md's text).

    Images that name PNG/JPEG/GIF/SVG files inside ``run_dir`` are inlined as
    data URIs; other links stay as they are (relative to the run folder).
    """
    env = {"run_dir": Path(run_dir) if run_dir is not None else None}
    body = _PARSER.render(markdown_text, env)
    title = env.get("title") or "Run report"
    return "\n".join([
        "<!DOCTYPE html>",
        '<html lang="en">',
        "<head>",
        '<meta charset="utf-8">',
        f'<meta http-equiv="Content-Security-Policy" content="{CSP}">',
        '<meta name="viewport" content="width=device-width, initial-scale=1">',
        f"<title>{escapeHtml(title)}</title>",
        f"<style>\n{STYLE}\n</style>",
        "</head>",
        "<body>",
        "<main>",
        body.rstrip("\n"),
        f'<footer>Rendered from <a href="{MARKDOWN_FILE}">{MARKDOWN_FILE}</a> '
        f"by emu.report with markdown-it-py; plots are embedded, links point to "
        f"files in the run folder.</footer>",
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
