"""Sphinx configuration of the course site (`make site`; book/README.md).

book/stage.py copies this file into the staged source folder (build/site-src), so
every path here is relative to that folder. The notebooks are rendered with their
stored outputs: nothing is executed.
"""

import os

project = "multigpu"
author = "the multigpu authors"
copyright = "the multigpu authors"  # noqa: A001 (Sphinx's name)

extensions = ["myst_nb"]
root_doc = "index"
exclude_patterns = ["_build", "_static", "**.ipynb_checkpoints"]
suppress_warnings = ["misc.highlighting_failure"]

# The stored outputs are the course's outputs: never re-execute.
nb_execution_mode = "off"
nb_merge_streams = True
myst_enable_extensions = ["dollarmath", "colon_fence"]
myst_heading_anchors = 3

html_theme = "sphinx_book_theme"
html_title = "multigpu: parallel training in PyTorch"
html_static_path = ["_static"]
html_last_updated_fmt = None
html_show_sourcelink = False
html_copy_source = True  # the download button offers the page's .ipynb or .md
html_favicon = "favicon.svg"  # else the browser asks for /favicon.ico (a 404)
# An explicit mode: without one, the theme logs "Got invalid theme mode" as an error.
html_context = {"default_mode": "auto"}

# MathJax 2 from a PyPI package (jupyter-server-mathjax), copied into _static by
# stage.py, so the site shows formulas offline and loads nothing from a CDN.
mathjax_path = "mathjax/MathJax.js?config=TeX-AMS-MML_HTMLorMML-full"
mathjax2_config = {
    "tex2jax": {
        "inlineMath": [["\\(", "\\)"]],
        "displayMath": [["\\[", "\\]"]],
        "processEscapes": True,
        "processClass": "math",
        "ignoreClass": "document|tex2jax_ignore",
    },
    # The package ships the STIX-Web fonts only (as Jupyter's classic notebook did).
    "HTML-CSS": {
        "availableFonts": [],
        "preferredFont": None,
        "webFont": "STIX-Web",
        "imageFont": None,
        # MathJax declares its blank fallback font at url('about:blank'), which
        # Chromium refuses with a console error; a local() name loads nothing.
        "styles": {
            "@font-face": {
                "font-family": "MathJax_Blank",
                "src": "local('MathJax_Blank')",
            }
        },
    },
    "messageStyle": "none",
}

_repository = os.environ.get("SITE_REPO_URL", "")
html_theme_options = {
    "show_toc_level": 2,
    "home_page_in_toc": True,
    "navigation_with_keys": False,
}
if _repository:
    html_theme_options.update(
        {
            "repository_url": _repository,
            "repository_branch": os.environ.get("SITE_REPO_BRANCH", "main"),
            "use_repository_button": True,
        }
    )
