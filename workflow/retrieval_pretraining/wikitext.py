"""Wikitext -> clean plain text, with our own linear-time regex cleaner (no template expansion).

Why our own: mwparserfromhell builds a full parse tree (about 4.4 CPU-s for the 106 articles of the
enwiki sample before any cleaning, slower than WikiExtractor's whole run), and WikiExtractor's
extractor is tied to its own template machinery and drops list items and leaves debris such as
"Alberta ()". Measured choice: see benchmarks/RESULTS.md ("Stage 2: extraction").

What is removed: HTML comments, <ref> and other non-prose tags (math, gallery, timeline, ...),
templates (innermost first, so nested ones go too; those listed below give their text),
tables ({| ... |}, {{(!}} ... {{!)}} and <table>), file and image links (with their captions),
category links, interlanguage links, magic words (__TOC__), bold/italic quotes (the apostrophes
MediaWiki shows as text kept: "''Iliad'''s" -> "Iliad's") and remaining HTML tags (their content
kept), and lines left with no letter or digit (what removed math or markup leaves).
The punctuation such removal leaves is tidied: no paragraph or list item starts with "," ";" or
". ", a line starting with one ends the line before ("is , where" -> "is, where"), ",." -> ".".
Templates that give text, as MediaWiki shows it: inline ones whose argument IS prose, like
{{lang-fr|...}} or {{nowrap|...}}; {{frac}} and {{As of}};
quotations ({{quote}}, {{blockquote}}, ...), each a paragraph of its own (inline in a list item,
which stays one);
ship-prefix templates ({{USS|Enterprise|CV-6}} -> USS Enterprise (CV-6));
date templates ({{birth date}}, {{death date and age}}, {{start date}}, {{dts}},
...) as "January 2, 1950", without an age.
Links become their label, external links their anchor text, interwiki links
([[wikt:word|label]], [[s:Title]]) their label or, as MediaWiki shows them, their target with its
prefix ("s:Title").
<nowiki> and <pre> content is text, as MediaWiki shows it: no markup in it is read ("[[A]]" stays),
its character references are decoded.
Kept: headings (each its own paragraph, only when their section has text), paragraphs (separated
by "\\n\\n"), list items (one per line inside their paragraph).
Sections whose heading is in `drop_sections` (See also, References, ...) are dropped whole.
"""

from __future__ import annotations

import functools
import html
import re
import string
from dataclasses import dataclass, field

# Tags whose content is not prose: removed with their content.
_DROP_CONTENT_TAGS = tuple(
    """ref references math chem ce gallery timeline score imagemap hiero graph mapframe maplink
    syntaxhighlight source templatedata inputbox categorytree includeonly table caption indicator
    section""".split()
)
# Tags that only format: removed, content kept. Anything else looking like a tag is left as text,
# so that "a < b > c" in prose survives.
_FORMAT_TAGS = tuple(
    """b i u s small big sup sub span div font center blockquote poem nowiki br hr p abbr cite code
    del ins em strong tt var q kbd samp dfn strike mark ruby rt rp bdi bdo wbr onlyinclude noinclude
    li ul ol dl dt dd pre h1 h2 h3 h4 h5 h6 time data translate tvar languages""".split()
)


def _names(text: str) -> tuple[str, ...]:
    """A comma-separated list of names (which may contain spaces) as a tuple."""
    return tuple(name.strip() for name in text.split(",") if name.strip())


# Inline templates whose output is the text of some positional arguments (1-based), joined by a
# space: {{nowrap|x}} -> x, {{lang|fr|x}} -> x, {{convert|5|km}} -> 5 km. -1 is the last one:
# {{transl|ar|x}} and {{transl|ar|ALA|x}} (the three-argument form puts the romanisation scheme
# second) -> x. Names are normalised (lowercase, "_" -> " "). Every other template is removed whole,
# but for those standing for a character (_CHAR_TEMPLATES) and fractions (_fraction).
_INLINE_TEMPLATES = {
    **dict.fromkeys(
        _names(
            """nowrap, nobr, nobreak, small, smaller, big, smallcaps, sc, sic, not a typo,
            visible anchor, vanchor, nihongo, abbr, em, strong, mvar, var, as written, w, keypress,
            gaps, ill, interlanguage link, sclass"""
        ),
        (1,),
    ),
    "lang": (2,),
    "transl": (-1,),
    **dict.fromkeys(("convert", "cvt"), (1, 2)),
}
# Prefixes of inline templates that keep their first argument, e.g. {{lang-fr|Bonjour}}.
_INLINE_PREFIXES = ("lang-",)
# {{convert|10|to|20|km}}: the second argument joins a range.
_RANGE_WORDS = {"to", "-", "–", "and", "or", "by", "x", "×", "and(-)", "to(-)", "+/-", "±"}
# Date templates that show their date (year, month, day) as "January 2, 1950", their default;
# df=/mf= are not read. "... and age" ones show an age after it, which depends on the day the page
# is read (or, for a death, is left to the reader): only the date is kept.
_DATE_TEMPLATES = frozenset(
    _names(
        """birth date, death date, birth date and age, death date and age, bda, dda,
        start date, end date, start date and age, end date and age, start-date, end-date, dts,
        date table sorting, birth year and age, death year and age, film date"""
    )
)
# Ship-prefix templates: {{USS|Enterprise|CV-6}} -> "USS Enterprise (CV-6)"; {{ship|USS|...}}
# takes the prefix as its first argument. Two-letter ones that name other templates ({{ns}}, ...)
# are left out.
_SHIP_PREFIXES = frozenset(
    _names(
        """uss, usns, uscgc, usrc, usat, hms, hmas, hmcs, hmnzs, hmsas, hmis, hmt, hmy, hmhs, ss,
        rms, mv, sms, smu, hnlms, hnoms, hdms, hswms, ins, ara, roks, tcg, orp, bap, kri, jds"""
    )
)
# Block quotations: their text is prose ({{quote}} is a redirect to {{blockquote}}).
_QUOTE_TEMPLATES = frozenset(
    _names("quote, blockquote, quotation, cquote, quote box, bq, block quote, centered pull quote")
)
# Inline templates that stand for a character, and those that write table markup where a raw
# "{|" would break the template around it ({{(!}} ... {{!)}}): given back as that markup, so the
# table is dropped like any other.
_CHAR_TEMPLATES = {
    "snd": " – ", "spaced ndash": " – ", "ndash": "–", "mdash": "—", "'": "'", "''": '"',
    "okina": "ʻ", "!": "|", "=": "=", "(!": "{|", "!)": "|}", "!-": "|-", "!!": "||",
}  # fmt: skip

DEFAULT_DISAMBIGUATION_TEMPLATES = _names(
    """disambiguation, disambig, disamb, dab, disambiguation cleanup, hndis, hndisambig, geodis,
    geodisambig, numberdis, letter-number combination disambiguation, mathdab, math dab, schooldis,
    species latin name disambiguation, genus disambiguation, place name disambiguation,
    road disambiguation, station disambiguation, airport disambiguation, call sign disambiguation,
    chinese title disambiguation"""
)
DEFAULT_DROP_SECTIONS = _names(
    """see also, references, external links, further reading, notes, footnotes, bibliography,
    sources, citations, notes and references, references and notes"""
)


@dataclass(frozen=True)
class CleanerOptions:
    """Site-specific names the cleaner needs (from <siteinfo> when the dump has one)."""

    file_prefixes: frozenset[str] = frozenset({"file", "image", "media"})
    category_prefixes: frozenset[str] = frozenset({"category"})
    drop_sections: frozenset[str] = field(default_factory=lambda: frozenset(DEFAULT_DROP_SECTIONS))


# --- regular expressions (compiled once; possessive quantifiers keep them linear) -----------------
# <nowiki> and <pre> content is text, not markup: MediaWiki shows it as written, only its character
# references decoded (and a <pre>'s own <nowiki> tags removed: CoreTagHooks). Read in one scan with
# comments, as MediaWiki's preprocessor reads both: "<nowiki><!--</nowiki>" shows "<!--".
# Its element runs to the first closing tag of its name (_elements: group "open" set).
_COMMENT_OR_NOWIKI = re.compile(
    r"<!--.*?(?:-->|\Z)|<(nowiki|pre)\b(?:[^>]*?/>|[^>]*+(?P<open>>))", re.S | re.I
)
# Its ASCII punctuation is held as character references, which html.unescape gives back as text
# once every markup pass is done: no markup these passes read is made of letters, digits or spaces.
_AS_REFERENCES = str.maketrans({c: f"&#{ord(c)};" for c in string.punctuation})
_DROP_TAGS = "|".join(_DROP_CONTENT_TAGS)
_SELF_CLOSING = re.compile(rf"<(?:{_DROP_TAGS})\b[^>]*?/>", re.I)
# Content runs to the first closing tag of its name, as MediaWiki's preprocessor reads it: a <ref>
# inside a <ref> is no nesting ("<ref>a <ref>b</ref>" is one ref, whose text the page never shows),
# and a <ref> left open ends at the next ref's </ref>. One with no closing tag after it is removed
# alone (_UNCLOSED_DROP; MediaWiki shows it as text).
_PAIRED = re.compile(rf"<({_DROP_TAGS})\b[^>]*+(?P<open>>)", re.I)  # the opening (_elements)
_UNCLOSED_DROP = re.compile(rf"</?(?:{_DROP_TAGS})\b[^>]*+>", re.I)  # also stray closing tags
# A <table> is HTML, no extension tag: tables nest, so they are removed innermost first, before
# _PAIRED (which would end the outer table at the inner one's </table> and leave its tail as text).
_HTML_TABLE = re.compile(r"<table\b[^>]*+>[^<]*+(?:<(?!/?table\b)[^<]*+)*+</table\s*>", re.I)
_TEMPLATE = re.compile(r"\{\{((?:[^{}]++|\{(?!\{)|\}(?!\}))*+)\}\}")
_LINK_PIPES = re.compile(r"\[\[[^\[\]]*+\]\]")
# A label may hold a [bracketed] part, such as an external link, that ends right at the link's own
# "]]" ("[[File:x.jpg|thumb|From [http://a.org the site]]]"): it is taken whole when the "]]" still
# follows it, so the link does not end one "]" early and leave a stray "]".
_LINK = re.compile(
    r"\[\[((?:[^\[\]]++|\[[^\[\]\n]*+\](?=[^\[\]]*+\]\])|\[(?!\[)|\](?!\]))*+)\]\]"
)
_EXTERNAL = re.compile(r"\[(?:https?:|ftp:|mailto:|//)[^\s\]]*+(?:[ \t]+([^\]\n]*))?\]", re.I)
_FORMAT_TAG = re.compile(rf"</?(?:{'|'.join(_FORMAT_TAGS)})\b[^>]*?/?>", re.I)
_BR = re.compile(r"<br\s*/?>", re.I)
_MAGIC = re.compile(r"__[A-Z]{3,}__")
_QUOTE_RUN = re.compile(r"('{2,})")
# Characters that are text, not markup, held as placeholders until the step that would read them
# as markup is done: "|" and "=" of {{!}}, {{=}} or a link in a template's argument separate and
# name no argument (until templates are removed); "'" of {{'}} or of a link's text is no quote
# markup (until quotes are read).
_PIPE, _EQUALS, _APOSTROPHE = "\x00", "\x01", "\x02"
_LITERAL = str.maketrans({"|": _PIPE, "=": _EQUALS, "'": _APOSTROPHE})
# Until quotes are read: what MediaWiki shows where the cleaner leaves nothing (a removed
# template's output, a <ref>'s marker, an image) or a link ends: no space and no apostrophe, so
# quote runs on either side stay apart, as in MediaWiki (''{{flag|Azores}}'' is no run of 4).
_SHOWN = "\x03"
_HEADING = re.compile(r"^(={1,6})\s*(.+?)\s*(={1,6})\s*$")  # unbalanced "== X ===" too
_LIST = re.compile(r"^[*#:;]+\s*")
_SPACES = re.compile(r"[ \t\u00a0\u2009\u200b]+")
# Not a dot that begins a word (".NET", ".uk", ".docx"): only one that ends what precedes it.
_SPACE_BEFORE_PUNCT = re.compile(r" +([,;:!?)\]]|\.(?!\w))")
_SPACED_ELLIPSIS = re.compile(r"(?<=\.) +(?=\.)")  # ". . .we" -> "...we"
_SPACE_AFTER_OPEN = re.compile(r"([(\[]) +")
_EMPTY_PARENS = re.compile(r"\s*\((?:[\s,;:.–—-]|or|and)*\)")
_LEADING_PUNCT_PARENS = re.compile(r"\(\s*[,;:]\s*")
_DANGLING_PUNCT = re.compile(r"\s*[,;:]\s*\)")  # "(Dutch: {{audio|...}})" -> "(Dutch)"
_REPEATED_PUNCT = re.compile(r"([,;])(?:\s*[,;])+")
# What a removed formula leaves around its punctuation: "<math>x</math>, which" starts a paragraph
# with ", which" (a ". . ." or "..." ellipsis is the text's own); "is\n<math>x</math>, where" joins
# lines as "is , where"; "Thus, <math>x</math>." gives "Thus,." (",..." is an ellipsis).
_LEADING_PUNCT = re.compile(r"^[,;.](?!\s*\.)\s+")
_CLOSING_PUNCT = re.compile(r"[,;)]|\.(?!\s*\.)(?=\s|$)")  # not ".5" nor ".NET"
_COMMA_BEFORE_STOP = re.compile(r"[,;]\s*\.(?=\s|$)")  # a stop, not ".NET" nor "..."
_INTERLANGUAGE = re.compile(r"^[a-z]{2,3}(?:-[a-z]{2,8})*$|^simple$")
# Interwiki prefixes (sister projects and a few sites) of enwiki's interwiki map: a link to them is
# text like any link, [[wikt:word|label]] -> label, [[s:Title]] -> s:Title. Several look like
# language codes (mw, doi, hdl, voy), which an interlanguage link would drop.
_INTERWIKI = frozenset(
    _names(
        """w, wikt, wiktionary, n, wikinews, b, wikibooks, q, wikiquote, s, wikisource, species,
        wikispecies, v, wikiversity, voy, wikivoyage, c, commons, m, meta, metawikimedia, mw,
        mediawikiwiki, d, wikidata, f, wikifunctions, foundation, wmf, incubator, outreach,
        wikitech, phab, phabricator, doi, hdl, arxiv, rfc, pmid, iarchive, gutenberg, oeis"""
    )
)
# A letter or digit: a line without one is what removed markup left ("+ +" of two {{chem}}, "."
# after a <math> line, "|}" of a table), not prose.
_LETTER_OR_DIGIT = re.compile(r"[^\W_]")
_MONTHS = (
    "January February March April May June July August September October November December".split()
)
_REDIRECT = re.compile(r"^\s*#\s*redirect", re.I)


def _template_name(body: str) -> str:
    name = body.split("|", 1)[0]
    return _SPACES.sub(" ", name.replace("_", " ")).strip().lower()


def _arguments(body: str) -> list[str]:
    """The arguments of a template body, positional and named, in order."""
    # Pipes inside links ([[target|label]]) do not separate arguments: hide them while splitting.
    # They stay hidden, as {{!}}'s do, until all templates are removed (remove_templates), so the
    # template around this one does not split what this one gives back.
    body = _LINK_PIPES.sub(lambda m: m.group(0).replace("|", _PIPE), body)
    return [a.strip() for a in body.split("|")[1:]]


def _is_named(argument: str) -> bool:
    return "=" in argument.split("[[", 1)[0]


def _positional(body: str) -> list[str]:
    """The positional arguments of a template body (named ones skipped), in order."""
    return [a for a in _arguments(body) if not _is_named(a)]


def _named(body: str) -> dict[str, str]:
    pairs = (a.split("=", 1) for a in _arguments(body) if _is_named(a))
    return {key.strip().lower(): value.strip() for key, value in pairs}


def _as_of(body: str) -> str:
    """{{As of|2008}} -> "As of 2008"; month and day as the template shows them (day first unless
    df=US), "as of" with lc=..., the alt= text instead when given."""
    named, date = _named(body), _positional(body)[:3]
    if named.get("alt"):
        return named["alt"]
    if len(date) >= 2 and date[1].isdigit() and 1 <= int(date[1]) <= 12:
        date[1] = _MONTHS[int(date[1]) - 1]
    if len(date) == 3:
        year, month, day = date
        us = named.get("df", "").lower() == "us"
        date = [f"{month} {day}, {year}"] if us else [day, month, year]
    elif len(date) == 2:
        date.reverse()
    prefix = "as of" if named.get("lc") else "As of"
    return " ".join([prefix, *date])


def _fraction(positional: list[str]) -> str:
    """{{frac|d}} -> 1/d, {{frac|n|d}} -> n/d, {{frac|w|n|d}} -> w n/d (as MediaWiki shows them)."""
    if len(positional) == 1:
        return f"1/{positional[0]}"
    if len(positional) == 2:
        return "/".join(positional)
    if len(positional) >= 3:
        return f"{positional[0]} {positional[1]}/{positional[2]}"
    return ""


def _date(positional: list[str]) -> str:
    """{{birth date|1950|1|2}} -> "January 2, 1950", {{start date|1950|1}} -> "January 1950",
    {{dts|1950}} -> "1950"; a date written out ({{start-date|July 16, 1969}}) is kept as written."""
    year, month, day = (positional + ["", "", ""])[:3]
    if not year.lstrip("-").isdigit():
        return year
    if month.isdigit() and 1 <= int(month) <= 12:
        month = _MONTHS[int(month) - 1]
    if day.isdigit():
        day = str(int(day))  # "02" -> "2"
    if month and day:
        return f"{month} {day}, {year}"
    return f"{month} {year}" if month else year


def _ship(prefix: str, positional: list[str]) -> str:
    """"USS Enterprise (CV-6)" from prefix, name, id and display code: the code (default 7) adds
    4 for the prefix, 2 for the name, 1 for the id ({{HMS|Ajax|22|6}} -> "HMS Ajax")."""
    name, ship_id, code = (positional + ["", "", ""])[:3]
    shown = int(code) if code.isdigit() and 1 <= int(code) <= 7 else 7
    parts = [prefix if shown & 4 else "", name if shown & 2 else ""]
    if ship_id and shown & 1:
        parts.append(f"({ship_id})" if shown & 2 else ship_id)
    return " ".join(part for part in parts if part)


def _quotation(body: str, inline: bool) -> str:
    """The quoted text of {{quote}} and its kin, a paragraph of its own as MediaWiki's blockquote
    is: text= (or quote=, 1=), else the first positional argument; the author and source after it
    are not the quotation. `inline`: on one line, no paragraph breaks (inside a list item)."""
    named, positional = _named(body), _positional(body)
    text = next((named[k] for k in ("text", "quote", "1") if named.get(k)), "")
    text = text or (positional[0] if positional else "")
    if inline:
        return " ".join(text.split())
    return f"\n\n{text}\n\n" if text else ""


def _in_list_item(match: re.Match) -> bool:
    """Whether the template starts on a list item's line. MediaWiki keeps a blockquote there
    inside the item; paragraph breaks would end the item, and the text after the quotation would
    no longer be one."""
    line_start = match.string.rfind("\n", 0, match.start()) + 1
    return bool(_LIST.match(match.string[line_start : match.start()]))


def _replace_template(match: re.Match) -> str:
    body = match.group(1)
    name = _template_name(body)
    if name in _CHAR_TEMPLATES:  # a character as text: {{nowrap|a{{!}}b}} -> "a|b"
        return _CHAR_TEMPLATES[name].translate(_LITERAL)
    if name in ("frac", "sfrac"):
        return _fraction(_positional(body))
    if name == "as of":  # marks a dated statement, whose sentence begins with it
        return _as_of(body)
    if name in _QUOTE_TEMPLATES:
        return _quotation(body, inline=_in_list_item(match))
    if name in _DATE_TEMPLATES:
        # {{death year and age|1993|1921}}: the second year is the birth, not a month.
        return _date(_positional(body)[: 1 if " year " in name else 3])
    if name in _SHIP_PREFIXES:
        prefix = body.split("|", 1)[0].strip()  # as written: "HNoMS", not "hnoms"
        return _ship(prefix, _positional(body))
    if name == "ship":
        positional = _positional(body)
        return _ship(positional[0], positional[1:]) if positional else ""
    if name.startswith(_INLINE_PREFIXES):
        keep: tuple[int, ...] = (1,)
    else:
        keep = _INLINE_TEMPLATES.get(name, ())
    if not keep:
        return _SHOWN
    positional = _positional(body)
    if name in ("convert", "cvt") and len(positional) >= 4 and positional[1] in _RANGE_WORDS:
        keep = (1, 2, 3, 4)  # {{convert|10|to|20|km}} -> "10 to 20 km"
    keep = tuple(len(positional) if i == -1 else i for i in keep)
    return " ".join(positional[i - 1] for i in keep if 1 <= i <= len(positional))


def _elements(opening: re.Pattern, text: str, replace) -> str:
    """Each match of `opening`, left to right, replaced by replace(match, content): a match whose
    group "open" is set opens an element that runs through the first closing tag named as its
    group 1 after it (`content` what lies between); any other match is whole (`content` None).
    An opening no closing tag follows is no element, and the scan goes on from its next character,
    as a regex's would. Once a name's closing tag is not found it is not looked for again
    (MediaWiki's preprocessor: noMoreClosingTag): a regex searched to the page's end from every
    such opening (O(n^2): 200 kB of "<ref>" took 23 s)."""
    out, done, at, unclosed = [], 0, 0, set()
    while (match := opening.search(text, at)) is not None:
        start, end = match.span()
        content = None
        if match.group("open") is not None:
            name = match.group(1).lower()
            closing = None if name in unclosed else _closing_tag(name).search(text, end)
            if closing is None:
                unclosed.add(name)
                at = start + 1
                continue
            content, end = text[end:closing.start()], closing.end()
        out += (text[done:start], replace(match, content))
        done = at = end
    out.append(text[done:])
    return "".join(out)


@functools.cache
def _closing_tag(name: str) -> re.Pattern:
    return re.compile(rf"</{re.escape(name)}\s*>", re.I)


def _comment_or_nowiki(match: re.Match, content: str | None) -> str:
    """Nothing for a comment; <nowiki> or <pre> content as text no pass reads, then _SHOWN: an
    empty one keeps quote runs apart ("''a''<nowiki/>''b''"), as MediaWiki's strip marker does."""
    tag, content = match.group(1), content or ""
    if not tag:
        return ""
    if tag.lower() == "pre":
        content = re.sub(r"<nowiki>(.*?)</nowiki>", r"\1", content, flags=re.S | re.I)
    return html.unescape(content).translate(_AS_REFERENCES) + _SHOWN


def remove_templates(text: str) -> str:
    """Remove templates innermost first, so a template inside another template's argument goes too."""
    while True:
        text, count = _TEMPLATE.subn(_replace_template, text)
        if not count:
            return text.replace(_PIPE, "|").replace(_EQUALS, "=")


def remove_tables(lines: list[str]) -> list[str]:
    """Drop wiki tables ({| ... |}, nested ones included) line by line. A table still open at the
    end of the page (its `|}` forgotten; MediaWiki closes it there) ends at the first section
    heading after it, so the sections that follow are kept, not dropped with it."""
    kept, depth, opened = [], 0, 0
    for i, line in enumerate(lines):
        stripped = line.lstrip(" :" + _SHOWN)
        if stripped.startswith("{|"):
            opened = i if depth == 0 else opened
            depth += 1
            continue
        if depth:
            if stripped.startswith("|}"):
                depth -= 1
            continue
        kept.append(line)
    if depth:
        after = next((j for j in range(opened + 1, len(lines))
                      if _HEADING.match(lines[j].strip())), None)
        if after is not None:
            kept += remove_tables(lines[after:])
    return kept


def _remove_quotes(text: str) -> str:
    """Drop bold/italic markup line by line, keeping the apostrophes MediaWiki shows as text
    (Parser::doQuotes): of a run of 4, the first ("''''x''''" -> "'x'"); of a run longer than 5,
    all but the last 5; and, when a line has an odd number of both bold and italic marks, one of a
    bold mark, which then reads "'" + italic: the first after a one-letter word ("l'''Homme"), else
    the first after a longer word ("''Iliad'''s" -> "Iliad's"), else the first after a space."""
    if "''" not in text:
        return text
    lines = text.split("\n")
    for n, line in enumerate(lines):
        if "''" not in line:
            continue
        parts = _QUOTE_RUN.split(line)  # text, run, text, run, ..., text
        texts, runs = parts[0::2], [len(run) for run in parts[1::2]]
        for i, run in enumerate(runs):  # texts[i] is the text before runs[i]
            if run == 4 or run > 5:
                markup = 3 if run == 4 else 5
                texts[i] += "'" * (run - markup)
                runs[i] = markup
        bold = sum(run in (3, 5) for run in runs)
        italic = sum(run in (2, 5) for run in runs)
        bolds = [i for i, run in enumerate(runs) if run == 3]
        if bold % 2 and italic % 2 and bolds:

            def rank(i: int) -> int:
                before = texts[i]
                if before.endswith(" "):
                    return 2
                # Parser.php compares bytes: a one-letter word's letter is one byte (ASCII).
                return 0 if before[-2:-1] == " " and before[-1].isascii() else 1

            texts[min(bolds, key=lambda i: (rank(i), i))] += "'"
        lines[n] = "".join(texts)
    return "\n".join(lines)


def _link_text(shown: str) -> str:
    """A link's text as MediaWiki's quote pass sees the link, a placeholder: none of its
    apostrophes is markup of the line around it (a label's quotes are read on the label alone, a
    title's are text), and it ends in no space, so a "'''" after it follows a word."""
    return shown.replace("'", _APOSTROPHE) + _SHOWN if shown else ""


def _make_link_replacer(options: CleanerOptions):
    def replace(match: re.Match) -> str:
        body = match.group(1)
        target, sep, label = body.partition("|")
        target = target.strip()
        visible = target.startswith(":")  # [[:Category:X]] is a visible link, not a category tag
        target = target.lstrip(":").strip()
        written, colon, rest = target.partition(":")
        prefix = written.strip().lower().replace("_", " ")
        # An interwiki link is shown as written, prefix and all, when it has no label: MediaWiki
        # shows [[wikt:word]] as "wikt:word".
        interwiki = prefix in _INTERWIKI and bool(rest[:1].strip())
        if colon and not visible and not interwiki:
            if prefix in options.file_prefixes:
                return _SHOWN
            if prefix in options.category_prefixes:
                return ""
            # An interlanguage link is written [[de:Berlin]]: a lowercase code, then the title at
            # once. [[CSI: Miami]] or [[Ben-Hur: A Tale of the Christ|Ben-Hur]] is an article.
            if _INTERLANGUAGE.match(written) and rest[:1].strip():
                return ""
        if sep:
            label = label.strip()
            if label:
                # Extra pipes only occur in file links (removed above); MediaWiki shows the rest.
                return _link_text(_remove_quotes(label))
            # Pipe trick: [[Paris, Texas|]] -> "Paris", [[Foo (bar)|]] -> "Foo".
            shown = rest if colon else target
            return _link_text(re.sub(r"\s*\(.*\)\s*$", "", shown.split(",")[0]).strip())
        return _link_text(target)

    return replace


def _clean_line(line: str) -> str:
    line = _SPACES.sub(" ", line)
    # Before the parenthesis rules, which strip one mark: "({{IPA|a}}; {{IPA|b}}; 1879)" left
    # "(; ; 1879)", and then "(; 1879)".
    line = _REPEATED_PUNCT.sub(r"\1", line)
    line = _LEADING_PUNCT_PARENS.sub("(", line)
    line = _DANGLING_PUNCT.sub(")", line)
    line = _EMPTY_PARENS.sub("", line)
    line = _SPACE_BEFORE_PUNCT.sub(r"\1", _SPACED_ELLIPSIS.sub("", line))
    line = _SPACE_AFTER_OPEN.sub(r"\1", line)
    line = _REPEATED_PUNCT.sub(r"\1", line)  # again: "A, (), B" is "A,, B" once "()" is gone
    line = _COMMA_BEFORE_STOP.sub(".", line)
    return line.strip()


def _paragraphs(lines: list[str], options: CleanerOptions) -> list[tuple[int, str]]:
    """Group cleaned lines into (heading level or 0, text) blocks; drop unwanted sections."""
    blocks: list[tuple[int, str]] = []
    current: list[str] = []
    current_is_list = False
    skip_level = 0  # inside a dropped section of this level (0: not skipping)

    def flush() -> None:
        nonlocal current
        if current:
            sep = "\n" if current_is_list else " "
            blocks.append((0, sep.join(current)))
        current = []

    for raw in lines:
        heading = _HEADING.match(raw.strip())
        if heading:
            level = min(len(heading.group(1)), len(heading.group(3)))
            title = _clean_line(heading.group(2).strip("= "))
            if skip_level and level > skip_level:
                continue
            skip_level = 0
            flush()
            if title.lower().rstrip(".:") in options.drop_sections:
                skip_level = level
                continue
            if title:
                blocks.append((level, title))
            continue
        if skip_level:
            continue
        if not raw.strip():
            flush()
            continue
        is_item = bool(_LIST.match(raw))
        text = _LIST.sub("", raw) if is_item else raw
        if raw.startswith("----"):
            text = raw.lstrip("-")
        text = _clean_line(text)
        if not _LETTER_OR_DIGIT.search(text):
            continue
        if is_item != current_is_list:
            flush()
            current_is_list = is_item
        if is_item or not current:  # punctuation cannot start a paragraph or a list item
            current.append(_LEADING_PUNCT.sub("", text))
        elif _CLOSING_PUNCT.match(text):  # "is\n<math>x</math>, where": it ends the line before
            current[-1] += text
        else:
            current.append(text)
    flush()
    return blocks


def _drop_empty_headings(blocks: list[tuple[int, str]]) -> list[str]:
    """Keep a heading only when some text follows it before the next heading of its level or higher."""
    kept: list[str] = []
    # text_below[l]: text follows this point before the next heading of level <= l (walking back).
    text_below = [False] * 7
    for level, text in reversed(blocks):
        if level == 0:
            text_below = [True] * 7
            kept.append(text)
            continue
        if text_below[level]:
            kept.append(text)
        for lower in range(level, 7):
            text_below[lower] = False
    kept.reverse()
    return kept


def clean(wikitext: str, options: CleanerOptions = CleanerOptions()) -> str:
    """Clean plain text of one article: paragraphs separated by a blank line, headings their own."""
    text = _elements(_COMMENT_OR_NOWIKI, wikitext, _comment_or_nowiki)
    text = _SELF_CLOSING.sub(_SHOWN, text)
    while True:  # innermost first
        text, count = _HTML_TABLE.subn(_SHOWN, text)
        if not count:
            break
    text = _elements(_PAIRED, text, lambda match, content: _SHOWN)
    text = _UNCLOSED_DROP.sub("", text)  # an unclosed <ref ...> whose content we cannot delimit
    text = remove_templates(text)
    text = text.replace("{{", "").replace("}}", "")  # unbalanced leftovers
    lines = remove_tables(text.split("\n"))
    text = "\n".join(lines)
    replace_link = _make_link_replacer(options)
    while True:
        text, count = _LINK.subn(replace_link, text)
        if not count:
            break
    # Quotes are read where MediaWiki reads them: after internal links, before external links and
    # HTML tags.
    text = _remove_quotes(text).replace(_APOSTROPHE, "'").replace(_SHOWN, "")
    text = _EXTERNAL.sub(lambda m: m.group(1) or "", text)
    text = _BR.sub(" ", text)
    text = _FORMAT_TAG.sub("", text)
    text = _MAGIC.sub("", text)
    text = html.unescape(text)
    blocks = _paragraphs(text.split("\n"), options)
    return "\n\n".join(_drop_empty_headings(blocks))


def is_redirect(wikitext: str) -> bool:
    return bool(_REDIRECT.match(wikitext))


def disambiguation_pattern(template_names) -> re.Pattern:
    """A template call {{name}} or {{name|...}} for any of the names (first letter, spaces, case free)."""
    alternatives = "|".join(
        r"[ _]+".join(re.escape(word) for word in name.split()) for name in template_names
    )
    return re.compile(rf"\{{\{{\s*(?:template\s*:\s*)?(?:{alternatives})\s*(?:\||\}}\}})", re.I)
