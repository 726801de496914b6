"""markdown-it block rules for report.html: the report's folds, and fences that close.

``folds_and_closed_fences(md)`` installs them (``md.use(...)``):

* ``<details><summary>TEXT</summary>`` and ``</details>``, on lines of their
  own at the top level or in another fold, become ``details_open``,
  ``summary_open``, an inline token holding TEXT, ``summary_close``, the
  body's block tokens and ``details_close`` (rendered as ``<details>``,
  ``<summary>`` ...).  With raw HTML off these are the only tags the Markdown
  can produce, and the summary and the body are Markdown, so they stay
  escaped.  An opener without its closer, a closer without its opener, and
  either one in a list or a quote are left to CommonMark: text.
* A top-level code fence that is never closed is text too, instead of
  running on to the end of the page; elsewhere CommonMark ends it with its
  list item, quote or fold.

Both are paired in one pass over the lines before the block parser runs
(``_pair_root_blocks``): however odd the Markdown, that costs linear time.
"""

from __future__ import annotations

import bisect
import re
from dataclasses import dataclass
from typing import Dict, List, Optional, Sequence, Tuple

from markdown_it import MarkdownIt
from markdown_it.rules_block import StateBlock, fence as commonmark_fence
from markdown_it.rules_core import StateCore

_FENCE_OPEN = re.compile(r"(`{3,}|~{3,})(.*)$")
_DETAILS_OPEN = re.compile(r"<details>[ \t]*<summary>(.*?)</summary>[ \t]*$", re.IGNORECASE)
_DETAILS_CLOSE = re.compile(r"</details>[ \t]*$", re.IGNORECASE)
# The blocks a fence may interrupt, as in markdown-it's own fence rule.
_BLOCK_STARTS = ["paragraph", "reference", "blockquote", "list"]
_ROOT_BLOCKS = "emu.report.root_blocks"     # where _root_blocks leaves its pairs in env


@dataclass(frozen=True)
class _RootBlocks:
    """Fences and folds of the page's top level, paired in one pass over its lines.

    Keys are source offsets of the opening line's first non-blank character.
    The line that opens a quote or a list item is parsed from after its ``>``
    or ``-``, so a fence or a fold there is not found: it is left to
    CommonMark, which ends an unclosed fence with its container.
    """

    fences: Dict[int, bool]     # opening fence -> a closing fence follows
    folds: Dict[int, int]       # <details><summary> line -> its </details> line


def _indent(line: str) -> Tuple[int, int]:
    """(columns, characters) of a line's leading blanks; tabs stop every 4 columns."""
    columns = chars = 0
    for char in line:
        if char == " ":
            columns += 1
        elif char == "\t":
            columns += 4 - columns % 4
        else:
            break
        chars += 1
    return columns, chars


def _fence_opening(text: str) -> Optional[Tuple[str, int]]:
    """(marker, length) when ``text`` opens a fenced code block (CommonMark's rule)."""
    match = _FENCE_OPEN.match(text)
    if match is None or (match.group(1)[0] == "`" and "`" in match.group(2)):
        return None
    return match.group(1)[0], len(match.group(1))


class _FenceClosers:
    """The lines that can close a fence of one marker, to find the first one quickly."""

    def __init__(self, candidates: List[Tuple[int, int]]):
        self.lines = [line for line, _ in candidates]
        self.runs = [run for _, run in candidates]
        # longest[i]: the longest run at or after candidate i (a failed search is a lookup).
        self.longest = self.runs[:]
        for index in range(len(self.longest) - 2, -1, -1):
            self.longest[index] = max(self.longest[index], self.longest[index + 1])

    def first_after(self, line: int, length: int) -> Optional[int]:
        """The first line after ``line`` that closes a fence ``length`` long, if any."""
        position = bisect.bisect_right(self.lines, line)
        if position == len(self.lines) or self.longest[position] < length:
            return None
        while self.runs[position] < length:
            position += 1
        return self.lines[position]


def _fence_closers(lines: Sequence[str]) -> Dict[str, _FenceClosers]:
    candidates: Dict[str, List[Tuple[int, int]]] = {"`": [], "~": []}
    for index, line in enumerate(lines):
        columns, chars = _indent(line)
        text = line[chars:].rstrip(" \t")
        if columns <= 3 and text[:1] in candidates and not text.strip(text[0]):
            candidates[text[0]].append((index, len(text)))
    return {marker: _FenceClosers(found) for marker, found in candidates.items()}


def _pair_root_blocks(src: str) -> _RootBlocks:
    """Pair fences and folds in one pass over the lines, however odd the Markdown."""
    lines = src.split("\n")
    starts = [0]
    for line in lines:
        starts.append(starts[-1] + len(line) + 1)
    closers = _fence_closers(lines)
    fences: Dict[int, bool] = {}
    folds: Dict[int, int] = {}
    open_folds: List[int] = []
    index = 0
    while index < len(lines):
        columns, chars = _indent(lines[index])
        text, offset = lines[index][chars:], starts[index] + chars
        opening = _fence_opening(text) if columns <= 3 else None
        if opening is not None:
            marker, length = opening
            end = closers[marker].first_after(index, length)
            fences[offset] = end is not None
            if end is not None:
                index = end + 1          # a </details> in code is code
                continue
        elif columns <= 3 and _DETAILS_OPEN.match(text):
            open_folds.append(offset)
        elif columns <= 3 and _DETAILS_CLOSE.match(text) and open_folds:
            folds[open_folds.pop()] = index
        index += 1
    return _RootBlocks(fences, folds)


def _root_blocks(state: StateCore) -> None:
    """Core rule, before the block parser: pair the top level's fences and folds."""
    state.env[_ROOT_BLOCKS] = _pair_root_blocks(state.src)


def _line(state: StateBlock, line: int) -> str:
    return state.src[state.bMarks[line] + state.tShift[line]:state.eMarks[line]]


def _outdented(state: StateBlock, line: int) -> bool:
    """A non-blank line indented less than the block: it ends a list item's content."""
    return (state.bMarks[line] + state.tShift[line] < state.eMarks[line]
            and state.sCount[line] < state.blkIndent)


def _closed_fence(state: StateBlock, start: int, end: int, silent: bool) -> bool:
    """CommonMark's fence rule, except that a top-level fence never closed is text."""
    offset = state.bMarks[start] + state.tShift[start]
    if state.env[_ROOT_BLOCKS].fences.get(offset) is False:
        return False
    return commonmark_fence(state, start, end, silent)


def _details(state: StateBlock, start: int, end: int, silent: bool) -> bool:
    """``<details><summary>TEXT</summary>`` ... ``</details>``: a fold of Markdown."""
    closer = state.env[_ROOT_BLOCKS].folds.get(state.bMarks[start] + state.tShift[start])
    if closer is None or closer >= end or state.is_code_block(start) or any(
            _outdented(state, line) for line in range(start + 1, closer + 1)):
        return False
    if silent:
        return True
    opener = _DETAILS_OPEN.match(_line(state, start))
    old_parent, old_line_max = state.parentType, state.lineMax
    state.parentType, state.lineMax = "details", closer    # type: ignore[assignment]
    token = state.push("details_open", "details", 1)
    token.block, token.map = True, [start, closer + 1]
    state.push("summary_open", "summary", 1)
    summary = state.push("inline", "", 0)
    summary.content, summary.children = opener.group(1).strip(), []
    summary.map = [start, start + 1]
    state.push("summary_close", "summary", -1)
    state.md.block.tokenize(state, start + 1, closer)
    state.push("details_close", "details", -1).block = True
    state.parentType, state.lineMax = old_parent, old_line_max
    state.line = closer + 1
    return True


def _fixed(html: str):
    return lambda self, tokens, index, options, env: html


def folds_and_closed_fences(md: MarkdownIt) -> None:
    """Install the pairing pass, the fold rule and the closed-fence rule into ``md``."""
    md.core.ruler.after("normalize", "root_blocks", _root_blocks)
    md.block.ruler.at("fence", _closed_fence, {"alt": _BLOCK_STARTS})
    md.block.ruler.before("fence", "details", _details)
    for name, html in (("details_open", "<details>"), ("summary_open", "<summary>"),
                       ("summary_close", "</summary>\n"), ("details_close", "</details>\n")):
        md.add_render_rule(name, _fixed(html))
