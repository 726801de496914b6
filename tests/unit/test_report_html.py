"""Tests for emu.report.html: report.html from a synthetic results folder."""

import base64
import csv
import re
from html.parser import HTMLParser

import pytest

from emu.report import main, write_report
from emu.report.html import render_html, write_html
from test_report import (FLOW_WARNING, FLOWS, PNG_SIGNATURE, SATURATION_WARNING,
                         synthetic_result, write_run)

VOID = {"area", "base", "br", "col", "embed", "hr", "img", "input", "link",
        "meta", "source", "track", "wbr"}
MALICIOUS = ('<script>alert("x")</script><img src=x onerror=alert(1)> '
             '[click](javascript:alert(2)) ![leak](../../../etc/passwd)')


class TagChecker(HTMLParser):
    """Records tags, attributes and text; fails on misnested or unclosed tags."""

    def __init__(self):
        super().__init__(convert_charrefs=True)
        self.stack, self.errors, self.starts = [], [], []
        self.attributes, self.text = [], []

    def handle_starttag(self, tag, attrs):
        self.starts.append(tag)
        self.attributes.append((tag, dict(attrs)))
        if tag not in VOID:
            self.stack.append(tag)

    def handle_startendtag(self, tag, attrs):
        self.starts.append(tag)
        self.attributes.append((tag, dict(attrs)))

    def handle_endtag(self, tag):
        if tag in VOID:
            self.errors.append(f"end tag for void element <{tag}>")
        elif not self.stack or self.stack[-1] != tag:
            self.errors.append(f"</{tag}> closes {self.stack[-1:] or 'nothing'}")
        else:
            self.stack.pop()

    def handle_data(self, data):
        self.text.append(data)


def compact(page: str) -> str:
    """The page without the line breaks markdown-it puts between block tags."""
    return re.sub(r">\n+<", "><", page)


def check_well_formed(page: str) -> TagChecker:
    checker = TagChecker()
    checker.feed(page)
    checker.close()
    assert checker.errors == []
    assert checker.stack == [], f"unclosed: {checker.stack}"
    for tag in ("html", "head", "body", "main", "title", "style"):
        assert checker.starts.count(tag) == 1, tag
    assert page.startswith("<!DOCTYPE html>")
    return checker


@pytest.fixture
def run(tmp_path):
    folder = write_run(tmp_path / "run")
    (folder / "captures").mkdir()
    (folder / "captures" / "h2-eth0.pcap").write_bytes(b"\xd4\xc3\xb2\xa1" + bytes(20))
    return folder


def test_write_report_writes_self_contained_html(run):
    written = write_report(run)
    html_path = run / "report.html"
    assert written[-1] == html_path and html_path.is_file()
    page = html_path.read_text(encoding="utf-8")
    checker = check_well_formed(page)
    text = " ".join(" ".join(checker.text).split())

    # Every src is an inlined data URI: no file, no network.
    sources = [attrs.get("src") for _, attrs in checker.attributes if "src" in attrs]
    assert len(sources) == 2
    assert all(src.startswith("data:image/png;base64,") for src in sources)
    assert not re.search(r'src="(?!data:)', page)
    assert base64.b64decode(sources[0].split(",", 1)[1])[:8] == PNG_SIGNATURE
    assert 'rel="stylesheet"' not in page and "<script" not in page
    assert "@import" not in page and "url(" not in page
    # Other files stay relative links.
    hrefs = [attrs["href"] for tag, attrs in checker.attributes if tag == "a"]
    assert "captures/h2-eth0.pcap" in hrefs and "flows.csv" in hrefs
    assert all("://" not in href for href in hrefs)

    # What was run, with the headline figures and their units.
    for expected in ("ocs-reconfig", "hybrid,k=4", "Open vSwitch, userspace (netdev) datapath",
                     "x0.001", "x400", "openvswitch 3.1.0",
                     "100 Mbit/s emulated (100 Gbit/s real)",
                     "blackout_ms 8.01 s 20 ms", "goodput_mbps 93.5 Mbit/s 93.5 Gbit/s",
                     "bytes_moved_bytes 400 MB 1.0 GB", "71.2 %"):
        assert expected in text, expected
    assert "<title>Run report: ocs-reconfig</title>" in page
    # Warnings, HTML-escaped ("<" in "0.41 < 0.90"), each in a blockquote.
    for warning in (SATURATION_WARNING, FLOW_WARNING,
                    "controller log held 1 warning line"):
        assert warning in text, warning
    assert "(ratio 0.41 &lt; 0.90)" in page
    assert checker.starts.count("blockquote") == 3
    # Order: what was run, warnings, metrics, plots ... the configuration last.
    positions = [page.index(f'id="{anchor}"') for anchor in
                 ("what-was-run", "fidelity-warnings-3", "headline-metrics",
                  "plots", "flows", "files", "resolved-configuration")]
    assert positions == sorted(positions)
    assert page.index("Open vSwitch, userspace (netdev) datapath") < page.index(SATURATION_WARNING)
    # Tables, the resolved configuration and lists survive the conversion.
    assert "<th>index</th><th>blackout (ms)</th><th>recovery (ms)</th>" in compact(page)
    # The configuration's heading and sentence stay visible; its JSON is folded.
    assert ('<h2 id="resolved-configuration">Resolved configuration</h2><p>The scenario as '
            'run') in compact(page)
    assert ('<details><summary>Show the configuration (JSON)</summary>'
            '<pre><code class="language-json">{') in compact(page)
    assert checker.starts.count("details") == 1 and checker.starts.count("pre") == 1
    assert "&quot;delay_real_ms&quot;: 20" in page
    assert page.index("&quot;delay_real_ms&quot;: 20") < page.index("</details>")
    assert "<li><strong>4 flows</strong>: 1 failed, 3 ok</li>" in page


def test_result_values_are_escaped(tmp_path):
    result = synthetic_result()
    result["scenario"] = "evil<b>x</b>"
    result["description"] = MALICIOUS
    result["datapath"] = "<iframe src=//example.com>"
    result["versions"]["<svg onload=alert(3)>"] = "1.0"
    result["warnings"] = ["</blockquote><script>alert(4)</script>"]
    result["metrics"]["note"] = "<details><summary>x</summary>"
    run = write_run(tmp_path / "evil", result=result)
    main([str(run)])
    page = (run / "report.html").read_text(encoding="utf-8")
    checker = check_well_formed(page)
    assert "script" not in checker.starts and "iframe" not in checker.starts
    assert "svg" not in checker.starts
    assert "&lt;script&gt;alert(&quot;x&quot;)&lt;/script&gt;" in page
    assert "&lt;iframe src=//example.com&gt;" in page
    assert "&lt;/blockquote&gt;&lt;script&gt;alert(4)&lt;/script&gt;" in page
    assert "javascript:" not in " ".join(
        value or "" for _, attrs in checker.attributes for value in attrs.values())
    # Only the two plots are images; the path outside the run folder is not read.
    sources = [attrs["src"] for tag, attrs in checker.attributes if tag == "img"]
    assert len(sources) == 2 and all(s.startswith("data:image/png") for s in sources)
    assert "root:" not in page
    assert "<title>Run report: evil&lt;b&gt;x&lt;/b&gt;</title>" in page
    assert "<td><code>evil&lt;b&gt;x&lt;/b&gt;</code></td>" in page
    # The metric that looks like a <details> opener is a table cell's text.
    assert "<td>&lt;details&gt;&lt;summary&gt;x&lt;/summary&gt;</td>" in page


def test_markdown_subset():
    markdown = "\n".join([
        "# Title with `a<b>` and *it* and **bold *nested***",
        "",
        "A paragraph with [a link](dir/file%20name.csv), a \\*literal\\* star,",
        "an unsafe [link](javascript:alert(1)) and a lone * star.",
        "",
        "| a | b\\|c | `x\\|y` |",
        "| --- | :---: | ---: |",
        "| 1 | **2** |",
        "| - | - | - |",
        "",
        "1. one",
        "2. two",
        "",
        "> quoted **text**",
        "> more",
        "",
        "<details><summary>More <b>details</b></summary>",
        "",
        "```",
        "</details> <script>",
        "```",
        "",
        "</details>",
        "",
        "![missing](nothing.png)",
    ])
    page = render_html(markdown, None)
    check_well_formed(page)
    assert ('<h1 id="title-with-a-b-and-it-and-bold-nested">Title with '
            "<code>a&lt;b&gt;</code> and <em>it</em> and "
            "<strong>bold <em>nested</em></strong></h1>") in page
    assert '<a href="dir/file%20name.csv">a link</a>' in page
    assert "a *literal* star" in page and "a lone * star" in page
    assert "an unsafe link and a lone * star.</p>" in page
    assert "javascript" not in page
    assert "<th>a</th><th style=\"text-align:center\">b|c</th>" in compact(page)
    assert "<code>x|y</code>" in page
    assert "<td>1</td><td style=\"text-align:center\"><strong>2</strong></td>" \
           "<td style=\"text-align:right\"></td>" in compact(page)
    assert "<tr><td>-</td><td style=\"text-align:center\">-</td>" in compact(page)
    assert "<ol>\n<li>one</li>\n<li>two</li>\n</ol>" in page
    assert "<blockquote>\n<p>quoted <strong>text</strong>\nmore</p>\n</blockquote>" in page
    # Raw HTML is text, in a paragraph or in code; a missing image is a link.
    assert "<p>&lt;details&gt;&lt;summary&gt;More &lt;b&gt;details&lt;/b&gt;" \
           "&lt;/summary&gt;</p>" in page
    assert "<pre><code>&lt;/details&gt; &lt;script&gt;\n</code></pre>" in page
    assert "<p>&lt;/details&gt;</p>" in page
    assert "details" not in check_well_formed(page).starts
    assert '<p><a class="missing-image" href="nothing.png">missing</a> (image not ' \
           'embedded)</p>' in page


def test_only_images_inside_the_run_folder_are_embedded(tmp_path):
    outside = tmp_path / "outside.png"
    outside.write_bytes(PNG_SIGNATURE + b"outside")
    run = tmp_path / "run"
    (run / "plots").mkdir(parents=True)
    (run / "plots" / "ok.png").write_bytes(PNG_SIGNATURE + b"inside")
    (run / "link.png").symlink_to(outside)
    (run / "fake.png").write_text("not a png")
    markdown = ("![ok](plots/ok.png) ![up](../outside.png) ![link](link.png) "
                "![fake](fake.png) ![abs](" + str(outside) + ") "
                "![remote](https://example.com/x.png)")
    page = render_html(markdown, run)
    checker = check_well_formed(page)
    images = [attrs for tag, attrs in checker.attributes if tag == "img"]
    assert [image["alt"] for image in images] == ["ok"]
    assert images[0]["src"] == ("data:image/png;base64,"
                                + base64.b64encode(PNG_SIGNATURE + b"inside").decode())
    hrefs = [attrs["href"] for tag, attrs in checker.attributes if tag == "a"]
    assert "../outside.png" in hrefs and "https://example.com/x.png" in hrefs
    assert page.count("(image not embedded)") == 5


def test_write_html_needs_report_md(tmp_path):
    with pytest.raises(FileNotFoundError, match="no report.md"):
        write_html(tmp_path)
    (tmp_path / "report.md").write_text("# Only text\n", encoding="utf-8")
    path = write_html(tmp_path)
    assert path.name == "report.html"
    assert '<h1 id="only-text">Only text</h1>' in path.read_text(encoding="utf-8")


def test_only_the_configuration_code_block_is_folded():
    markdown = "\n".join([
        "<details><summary>Raw *a* <i>b</i></summary>",
        "",
        "```",
        "first",
        "```",
        "",
        "</details>",
        "",
        "## Resolved configuration",
        "",
        "> ```",
        "> quoted",
        "> ```",
        "",
        "```json",
        '{"a": "</details><script>alert(1)</script>"}',
        "```",
        "",
        "```",
        "second block",
        "```",
        "",
        "### Resolved configuration",
        "",
        "```",
        "an h3 is another section",
        "```",
    ])
    page = render_html(markdown, None)
    checker = check_well_formed(page)
    # One fold, around the section's first top-level code block only.
    assert checker.starts.count("details") == 1 and checker.starts.count("summary") == 1
    assert not {"i", "script"} & set(checker.starts)
    assert "<p>&lt;details&gt;&lt;summary&gt;Raw <em>a</em> &lt;i&gt;b&lt;/i&gt;" \
           "&lt;/summary&gt;</p>" in page
    assert ("<details>\n<summary>Show the configuration (JSON)</summary>\n"
            '<pre><code class="language-json">{&quot;a&quot;: &quot;&lt;/details&gt;'
            "&lt;script&gt;alert(1)&lt;/script&gt;&quot;}\n</code></pre>\n</details>\n"
            "<pre><code>second block") in page
    assert "<blockquote>\n<pre><code>quoted\n</code></pre>\n</blockquote>" in page
    # A section with no code block before the next heading folds nothing.
    page = render_html("## Resolved configuration\n\nNone.\n\n## Next\n\n```\nx\n```\n",
                       None)
    assert "details" not in check_well_formed(page).starts


def test_only_safe_link_schemes_are_kept():
    markdown = "\n".join([
        "[a](JavaScript:alert(1)) [b](vbscript:x) [c](data:text/html,x) [d](file:///etc/x)",
        "[e](&#106;avascript:alert(3)) <javascript:alert(4)> [f][ref]",
        "[g](https://example.com/x?a=1&b=2) [h](mailto:ops@example.com) [i](../up/file.csv)",
        "[j](#flows) [k](captures/h1%20eth0.pcap)",
        "",
        "[ref]: javascript:alert(5)",
    ])
    page = render_html(markdown, None)
    checker = check_well_formed(page)
    hrefs = [attrs["href"] for tag, attrs in checker.attributes if tag == "a"]
    assert hrefs == ["https://example.com/x?a=1&b=2", "mailto:ops@example.com",
                     "../up/file.csv", "#flows", "captures/h1%20eth0.pcap", "report.md"]
    # A dropped link keeps its text.
    assert set("abcdef") <= set(" ".join(checker.text).split())


def test_svg_and_jpeg_files_of_the_run_are_inlined(tmp_path):
    run = tmp_path / "run"
    run.mkdir()
    svg = (b'<?xml version="1.0"?>\n<svg xmlns="http://www.w3.org/2000/svg" width="4" '
           b'height="4"><rect width="4" height="4"/></svg>\n')
    (run / "plot.svg").write_bytes(svg)
    (run / "photo.jpg").write_bytes(b"\xff\xd8\xff\xe0" + bytes(16))
    (run / "fake.svg").write_text("<html><body>not an image</body></html>")
    page = render_html("![s](plot.svg) ![j](photo.jpg) ![f](fake.svg)", run)
    images = [attrs for tag, attrs in check_well_formed(page).attributes if tag == "img"]
    assert [image["src"].split(";")[0] for image in images] == ["data:image/svg+xml",
                                                                 "data:image/jpeg"]
    assert base64.b64decode(images[0]["src"].split(",", 1)[1]) == svg
    assert '<a class="missing-image" href="fake.svg">f</a> (image not embedded)' in page


def test_page_keeps_its_style_and_content_security_policy():
    page = render_html("# Styled\n\n| a |\n| --- |\n| 1 |\n", None)
    check_well_formed(page)
    assert ('<meta http-equiv="Content-Security-Policy" content="default-src \'none\'; '
            'img-src data:; style-src \'unsafe-inline\'; base-uri \'none\'; '
            'form-action \'none\'">') in page
    assert ".table-wrap { overflow-x: auto; margin: .6rem 0 1rem; }" in page
    assert '<div class="table-wrap"><table>' in page and "</table></div>" in page
    assert "<title>Styled</title>" in page


def test_hostile_values_cannot_swallow_the_page(tmp_path):
    # Every kind of value report.md prints, each trying to start a block of its
    # own on a new line: a fence that never closes, a heading, a fold, a quote.
    hostile = "x\n```\n# h\r~~~\r\n<details><summary>s</summary>\n> q"
    result = synthetic_result()
    # (The scenario also titles the plots: no carriage return there, which has no glyph.)
    result.update({"scenario": hostile.replace("\r", " "), "description": hostile,
                   "started": hostile, "datapath": hostile, "versions": {hostile: hostile},
                   "warnings": [hostile]})
    result["fabric"].update({"spec": hostile, "hosts": hostile})
    result["config"]["note"] = hostile + "\n```"
    result["fidelity"]["cpu"]["processes"] = {hostile: {"mean_pct_of_core": 1.0}}
    result["fidelity"]["cpu"]["samples"] = hostile
    result["fidelity"]["flows_checked"] = hostile
    result["fidelity"]["alone_flows"][0]["id"] = hostile
    result["metrics"].update({hostile: hostile, "notes": [hostile, "```", "~~~"],
                              "list_" + hostile: [{hostile: hostile}]})
    flows = [dict(row, id=hostile, src=hostile, status=hostile) for row in FLOWS]
    run = write_run(tmp_path / "run", result=result, flows=None)
    with (run / "flows.csv").open("w", newline="") as handle:
        writer = csv.DictWriter(handle, fieldnames=list(FLOWS[0]))
        writer.writeheader()
        writer.writerows(flows)
    (run / "x\n```").write_text("a file whose name opens a fence")
    main([str(run)])
    # Lines as CommonMark reads them ("\r" ends one too): the only fence lines
    # are the configuration's own, at the end.
    lines = re.split(r"\r\n?|\n", (run / "report.md").read_text(encoding="utf-8").rstrip())
    fences = [i for i, line in enumerate(lines) if line.lstrip("> -").startswith(("```", "~~~"))]
    assert [lines[i] for i in fences] == ["```json", "```"] and fences[-1] == len(lines) - 1
    page = (run / "report.html").read_text(encoding="utf-8")
    checker = check_well_formed(page)
    # Every section is there, in order, and the one code block is the configuration's.
    positions = [page.index(f'<h2 id="{anchor}"') for anchor in
                 ("what-was-run", "fidelity-warnings-3", "headline-metrics",
                  "reading-the-figures", "steps", "plots", "flows", "files",
                  "resolved-configuration")]
    assert positions == sorted(positions)
    assert checker.starts.count("pre") == 1 and checker.starts.count("details") == 1
    assert checker.starts.count("h1") == 1 and checker.starts.count("blockquote") == 3
    assert checker.starts.count("summary") == 1
    assert page.index("<pre>") > page.index('id="resolved-configuration"')
    assert checker.starts.count("img") == 2
    assert "&lt;details&gt;&lt;summary&gt;s&lt;/summary&gt;" in page
