"""Every caption under workflow/report/ renders as reStructuredText without a docutils message.

`snakemake --report` renders each caption through Jinja and then docutils' `publish_parts`, and
docutils turns a mistake into a red "System Message" block inside the report page (a bare
`|x|` is read as a substitution reference, for one) while the run carries on. Rendered here the
same way, with the demo's config and stand-in wildcards, at docutils' warning level.
"""

from __future__ import annotations

import io
from pathlib import Path
from types import SimpleNamespace

import jinja2
import pytest
import yaml
from docutils.core import publish_parts

ROOT = Path(__file__).resolve().parent.parent
CAPTIONS = sorted((ROOT / "workflow" / "report").glob("*.rst"))


class _Wildcards(SimpleNamespace):
    def __getattr__(self, name: str) -> str:  # any wildcard a caption names
        return f"<{name}>"


def _messages(text: str) -> str:
    warnings = io.StringIO()
    publish_parts(text, writer="html",
                  settings_overrides={"warning_stream": warnings, "report_level": 2,
                                      "halt_level": 5})
    return warnings.getvalue()


@pytest.mark.parametrize("caption", CAPTIONS, ids=lambda path: path.name)
def test_each_report_caption_renders_without_a_docutils_message(caption):
    config = yaml.safe_load((ROOT / "config.yaml").read_text())
    snakemake = SimpleNamespace(config=config, wildcards=_Wildcards())
    text = jinja2.Environment(undefined=jinja2.StrictUndefined).from_string(
        caption.read_text()).render(snakemake=snakemake)
    assert _messages(text) == ""


def test_a_bare_bar_pair_is_what_the_check_reports():
    """The broken variant: coverage.rst's formula before it was a literal."""
    assert "Undefined substitution referenced" in _messages("the share, |top-k ∩ T| / |T|, is")
