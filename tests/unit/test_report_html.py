"""Tests for emu.report_html: report.html from a synthetic results folder."""

import base64
import re
from html.parser import HTMLParser

import pytest

from emu.report import main, write_report
from emu.report_html import render_html, write_html
from test_report import (FLOW_WARNING, PNG_SIGNATURE, SATURATION_WARNING,
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
    for expected in ("ocs-reconfig", "hybrid,k=4", "netdev (OVS userspace datapath)",
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
    # Order: what was run, warnings, metrics, plots.
    positions = [page.index(f'id="{anchor}"') for anchor in
                 ("what-was-run", "fidelity-warnings-3", "headline-metrics",
                  "plots", "flows")]
    assert positions == sorted(positions)
    assert page.index("netdev (OVS userspace datapath)") < page.index(SATURATION_WARNING)
    # Tables, the resolved configuration and lists survive the conversion.
    assert "<th>index</th><th>blackout (ms)</th><th>recovery (ms)</th>" in page
    assert "<details><summary>Resolved configuration</summary>" in page
    assert '<pre><code class="language-json">' in page
    assert "&quot;delay_real_ms&quot;: 20" in page
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
        "```",
        "never closed",
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
    assert "<th>a</th><th style=\"text-align: center\">b|c</th>" in page
    assert "<code>x|y</code>" in page
    assert "<td>1</td><td style=\"text-align: center\"><strong>2</strong></td>" \
           "<td style=\"text-align: right\"></td>" in page
    assert "<tr><td>-</td><td style=\"text-align: center\">-</td>" in page
    assert "<ol>\n<li>one</li>\n<li>two</li>\n</ol>" in page
    assert "<blockquote>\n<p>quoted <strong>text</strong>\nmore</p>\n</blockquote>" in page
    assert "<details><summary>More &lt;b&gt;details&lt;/b&gt;</summary>" in page
    assert "<pre><code>&lt;/details&gt; &lt;script&gt;</code></pre>" in page
    # An unclosed fence does not swallow what follows; a missing image is a link.
    assert "<p>```</p>\n<p>never closed\n" in page
    assert '<a class="missing-image" href="nothing.png">missing</a> (image not ' \
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
