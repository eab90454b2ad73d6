"""The documentation site (Sphinx + MyST): `python -m sphinx -W --keep-going -n -b html docs docs/_build/html`.

Strict in the test command (tests/docs/test_site.py): every warning (a broken link, a missing page or anchor, a page
left out of every toctree) fails the build. The configuration and command references are generated from the typed
schema and the entry points' parsers when the build starts (docs/_ext/reference.py), never written by hand.
"""
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path[:0] = [str(HERE / "_ext"), str(HERE.parent)]

project = "pipeline"
copyright = "the pipeline's authors"
author = "pipeline contributors"
extensions = ["myst_parser", "reference"]
source_suffix = {".md": "markdown"}
root_doc = "index"
exclude_patterns = ["_build", "_ext", "README.md"]
# GitHub-style anchors for headings, so `page.md#a-heading` links resolve (and a missing anchor is a warning).
myst_heading_anchors = 4
myst_enable_extensions = ["colon_fence", "deflist"]
html_theme = "furo"
html_title = "pipeline: EAGLE-3 training shards"
html_static_path = []
nitpicky = True
# An inline path such as `pipeline/points.py` is code, not a link; links to files outside docs/ are written as code.
suppress_warnings = []
