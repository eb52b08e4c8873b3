"""Sphinx configuration: the tftrain documentation site.

Build it (CI does, with warnings as errors):

    sphinx-build -W --keep-going -q -b html docs docs/_build/html

Pages are MyST Markdown; the API reference is generated from the Google-style
docstrings by autodoc + napoleon. No internet is needed (no intersphinx).
"""

from __future__ import annotations

import os
import re
import sys

# Document this checkout's source, installed or not.
sys.path.insert(0, os.path.abspath(".."))
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")

import tftrain

project = "tftrain"
author = "tftrain authors"
copyright = "tftrain authors"
version = tftrain.__version__
release = tftrain.__version__

extensions = [
    "myst_parser",
    "sphinx.ext.autodoc",
    "sphinx.ext.napoleon",
    "sphinx.ext.viewcode",
]

source_suffix = {".md": "markdown"}
root_doc = "index"
exclude_patterns = ["_build", "_templates", "Thumbs.db", ".DS_Store"]

# Docstrings write code as Markdown does, in single backticks: render those as
# (cross-referenced where possible) code rather than RST's default italics.
default_role = "py:obj"

# MyST: `[page.md](page.md#a-heading)` links between pages resolve, with
# anchors for headings down to ###.
myst_heading_anchors = 3

# autodoc + napoleon (Google style only).
autodoc_member_order = "bysource"
autodoc_typehints = "signature"
autodoc_default_options = {"show-inheritance": True}
# Defaults as written in the source (`targets=TARGETS`, not a long repr).
autodoc_preserve_defaults = True
# Only what tftrain documents: Keras hooks a callback overrides (on_epoch_end,
# ...) would otherwise repeat Keras's docstrings.
autodoc_inherit_docstrings = False
napoleon_google_docstring = True
napoleon_numpy_docstring = False
napoleon_include_init_with_doc = False
# "Attributes:" sections become fields of the class, so dataclass fields that
# autodoc also finds are not described twice.
napoleon_use_ivar = True

# pydata-sphinx-theme: a search box in the header, every page in the left
# sidebar, the page's headings on the right. The theme's own left sidebar shows
# only the pages under the current top-level page, and these pages are one flat
# level under index, so _templates/sidebar-nav-site.html lists the whole site
# (grouped by the toctree captions of index.md) instead. The page list lives in
# that sidebar, not in the header.
html_theme = "pydata_sphinx_theme"
html_title = f"tftrain {release}"
templates_path = ["_templates"]
html_sidebars = {"**": ["sidebar-nav-site.html"]}
html_theme_options = {
    "navbar_center": [],
    "secondary_sidebar_items": ["page-toc"],
    "show_toc_level": 2,
    "navigation_with_keys": False,
    "footer_start": ["copyright"],
    "footer_end": ["sphinx-version"],
}

_FENCE = re.compile(r"^(\s*)```(\w*)\s*$")


def _markdown_fences_to_rst(app, what, name, obj, options, lines: list[str]) -> None:
    """Turns ```python fences in docstrings into `code-block` directives.

    The docstrings follow the Markdown pages' convention for code examples; RST
    would read a fence as a broken inline literal.
    """
    out: list[str] = []
    fence_indent: str | None = None
    for line in lines:
        match = _FENCE.match(line)
        if match and fence_indent is None:
            fence_indent = match.group(1)
            out.extend([f"{fence_indent}.. code-block:: {match.group(2) or 'text'}", ""])
        elif match and match.group(1) == fence_indent:
            fence_indent = None
            out.append("")
        elif fence_indent is not None:
            body = line[len(fence_indent) :] if line.startswith(fence_indent) else line.lstrip()
            out.append(f"{fence_indent}   {body}" if line.strip() else "")
        else:
            out.append(line)
    lines[:] = out


def _skip_namedtuple_fields(app, what, name, obj, skip, options):
    """Skips NamedTuple fields: their class docstring's Attributes describe them."""
    if (getattr(obj, "__doc__", None) or "").startswith("Alias for field number"):
        return True
    return None


def setup(app):
    app.connect("autodoc-skip-member", _skip_namedtuple_fields)
    # Before napoleon (priority 500), which reads sections by indentation.
    app.connect("autodoc-process-docstring", _markdown_fences_to_rst, priority=400)
