"""markdown_to_html: the Markdown subset the package writes, as the HTML the report shows."""

from retrieval_pretraining.markdown_html import markdown_to_html

PAGE = """# Results

### Table 2

| system | nDCG@10 |
|---|---:|
| BM25 (k1=0.9, b=0.4) | 0.665 |
| *hard negatives* | |
| COSTA | **0.701**† |

- config hash: `abc`
- 1 < 2 & 3 > 2
Legend: a plain paragraph.
"""


def test_headings_tables_lists_and_paragraphs():
    body = markdown_to_html(PAGE, "Results: demo").split("<body>\n", 1)[1]
    assert body.splitlines() == [
        "<h1>Results</h1>",
        "<h3>Table 2</h3>",
        "<table>",
        "<tr><th>system</th><th>nDCG@10</th></tr>",  # the |---| row is dropped
        "<tr><td>BM25 (k1=0.9, b=0.4)</td><td>0.665</td></tr>",
        "<tr><td><i>hard negatives</i></td><td></td></tr>",
        "<tr><td>COSTA</td><td><b>0.701</b>†</td></tr>",
        "</table>",
        "<ul>",
        "<li>config hash: <code>abc</code></li>",
        "<li>1 &lt; 2 &amp; 3 &gt; 2</li>",
        "</ul>",
        "<p>Legend: a plain paragraph.</p>",
        "</body></html>",
    ]


def test_a_standalone_page_with_an_escaped_title():
    page = markdown_to_html("text", "a <b> & c")
    assert page.startswith("<!DOCTYPE html><html><head><meta charset='utf-8'>")
    assert "<title>a &lt;b&gt; &amp; c</title>" in page and page.endswith("</html>\n")


def test_a_lone_asterisk_before_a_space_closes_no_italics():
    """The legend of a table with both a measured published value and a measured reference row
    (paper.yaml's SciFact table) holds "(*: not published ...)" and later "; * marks a value":
    Markdown closes emphasis only at a `*` after a non-space, so neither is italics; pairing them
    dropped both asterisks and set the text between in italics in the report's HTML."""
    legend = ("the published value (*: not published but measured on the same data) and our "
              "delta; * marks a value not published but measured on the same data (Pyserini).")
    body = markdown_to_html(legend, "t").split("<body>\n", 1)[1]
    assert body.splitlines()[0] == f"<p>{legend}</p>"
    assert markdown_to_html("*a b* and ( *c* )", "t").count("<i>") == 2


def test_an_escaped_character_and_a_code_spans_content_are_not_markup():
    """A label's own `*`, `_`, `<` and backtick come escaped (tables/render.py): shown as written,
    as Markdown shows `\\*`; a code span's `*` is no emphasis either; markup beside them is."""
    body = markdown_to_html("\\*x\\* \\<b> \\`c\\` a\\_b \\\\ `p*q*r` **1** *i*", "t")
    assert "<p>*x* &lt;b&gt; `c` a_b \\ <code>p*q*r</code> <b>1</b> <i>i</i></p>" in body, body
