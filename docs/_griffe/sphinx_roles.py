"""A Griffe extension for the API reference: Sphinx roles in docstrings (``:meth:`x```,
``:class:`~a.b.C```) become Markdown code spans, as the source's readers see them."""

from __future__ import annotations

import re
from typing import Any

import griffe

_ROLE = re.compile(r":(?:meth|class|func|attr|data|mod|exc|obj):`(~?)([^`]+)`")


def _span(match: re.Match[str]) -> str:
    short, target = match.groups()
    return f"`{target.rsplit('.', 1)[-1] if short else target}`"


class SphinxRoles(griffe.Extension):
    def on_instance(self, *, obj: griffe.Object, **kwargs: Any) -> None:
        if obj.docstring is not None:
            obj.docstring.value = _ROLE.sub(_span, obj.docstring.value)
