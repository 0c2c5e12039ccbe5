"""MkDocs hooks for the documentation site (mkdocs.yml names this file under ``hooks``).

- The generated API reference (reference/api.md) must cover every name in the package root's
  ``__all__``: a name that is neither rendered (``::: selvedge_django.NAME``, or a member list
  under ``::: selvedge_django.exceptions``) nor a list item (``- `NAME`: ...``) is a warning, so
  ``mkdocs build --strict`` fails when a public name is added without its entry.
- Docstrings are written with reStructuredText roles (``:class:`Worker```); in Markdown these
  render as the role's text before the code, which the rendered page drops.

The package is read statically (mkdocstrings' griffe never imports it), so the build needs no
Django settings and no database.
"""

from __future__ import annotations

import ast
import logging
import re
from pathlib import Path
from typing import Any

log = logging.getLogger("mkdocs.hooks.selvedge")

ROOT = Path(__file__).resolve().parent.parent
API_PAGE = "reference/api.md"
ROLE = re.compile(r":(?:class|func|meth|mod|attr|exc|data|obj):(?=<code>)")


def public_names(module: Path) -> list[str]:
    """The names a module's ``__all__`` lists, read without importing it."""
    for node in ast.parse(module.read_text(encoding="utf-8")).body:
        if (
            isinstance(node, ast.Assign)
            and isinstance(node.targets[0], ast.Name)
            and node.targets[0].id == "__all__"
            and isinstance(node.value, ast.List)
        ):
            return [e.value for e in node.value.elts if isinstance(e, ast.Constant)]
    raise ValueError(f"no __all__ list in {module}")


def on_page_markdown(markdown: str, page: Any, **kwargs: Any) -> str:
    if page.file.src_uri != API_PAGE:
        return markdown
    covered = set(re.findall(r"^::: selvedge_django\.(\w+)", markdown, flags=re.MULTILINE))
    covered |= set(re.findall(r"^ {8}- (\w+)$", markdown, flags=re.MULTILINE))
    covered |= set(re.findall(r"^- `(\w+)`:", markdown, flags=re.MULTILINE))
    covered.add("hooks")  # the module, rendered in its own section
    for name in public_names(ROOT / "selvedge_django" / "__init__.py"):
        if name not in covered:
            log.warning("%s does not cover selvedge_django.%s", API_PAGE, name)
    return markdown


def on_page_content(html: str, **kwargs: Any) -> str:
    return ROLE.sub("", html)
