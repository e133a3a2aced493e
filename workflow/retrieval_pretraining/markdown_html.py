"""The small Markdown subset this package writes (headings, pipe tables, lists, paragraphs) as a
standalone HTML page, for the Snakemake report, which shows HTML, not Markdown.

Used by the results tables, the CPDAE top-words analysis and the per-stage statistics page.
"""

from __future__ import annotations

import html
import re


# A backslash-escaped ASCII punctuation character (a label's own `*`, `_`, `<`: tables/render.py)
# or a code span, whichever starts first: neither's content is markup.
_LITERAL = re.compile(r"\\([!-/:-@\[-`{-~])|`([^`]+)`")


def _inline(text: str) -> str:
    """Bold, italics and code spans inside one line (after escaping the text); a backslash-escaped
    character is shown as itself, as Markdown shows it."""
    literals: list[str] = []

    def hold(match: re.Match) -> str:
        literal = html.escape(match[1] if match[1] is not None else match[2], quote=False)
        literals.append(literal if match[1] is not None else f"<code>{literal}</code>")
        return f"\0{len(literals) - 1}\0"

    text = html.escape(_LITERAL.sub(hold, text), quote=False)
    text = re.sub(r"\*\*(.+?)\*\*", r"<b>\1</b>", text)
    # Emphasis opens at a `*` before a non-space and closes at one after a non-space (as
    # Markdown's flanking rules): a legend's "(*: measured ...)" and "; * marks" are no pair.
    text = re.sub(r"(?<![*\w])\*([^*\s](?:[^*]*?[^*\s])?)\*(?![*\w])", r"<i>\1</i>", text)
    return re.sub("\0(\\d+)\0", lambda match: literals[int(match[1])], text)


def markdown_to_html(markdown: str, title: str) -> str:
    """`markdown` as a standalone HTML page titled `title`."""
    out, table, in_list = [], None, False
    for line in markdown.splitlines() + [""]:
        stripped = line.strip()
        if stripped.startswith("|"):
            # A cell's own `|` is written `\\|` (tables/render.py), as in GitHub's tables.
            cells = [c.strip().replace("\\|", "|")
                     for c in re.split(r"(?<!\\)\|", stripped.strip("|"))]
            if all(set(c) <= set("-:") and c for c in cells):
                continue  # the header separator row
            if table is None:
                table = [
                    "<table>",
                    "<tr>" + "".join(f"<th>{_inline(c)}</th>" for c in cells) + "</tr>",
                ]
            else:
                table.append("<tr>" + "".join(f"<td>{_inline(c)}</td>" for c in cells) + "</tr>")
            continue
        if table is not None:
            out += table + ["</table>"]
            table = None
        if stripped.startswith("- "):
            if not in_list:
                out.append("<ul>")
                in_list = True
            out.append(f"<li>{_inline(stripped[2:])}</li>")
            continue
        if in_list:
            out.append("</ul>")
            in_list = False
        if stripped.startswith("#"):
            level = len(stripped) - len(stripped.lstrip("#"))
            out.append(f"<h{level}>{_inline(stripped[level:].strip())}</h{level}>")
        elif stripped:
            out.append(f"<p>{_inline(stripped)}</p>")
    style = (
        "body{font-family:sans-serif;margin:1.5em}table{border-collapse:collapse;margin:.5em 0}"
        "td,th{border:1px solid #ccc;padding:3px 8px}td{text-align:right}"
        "td:first-child{text-align:left}code{font-size:90%}"
    )
    return (
        f"<!DOCTYPE html><html><head><meta charset='utf-8'><title>{html.escape(title)}</title>"
        f"<style>{style}</style></head><body>\n" + "\n".join(out) + "\n</body></html>\n"
    )
