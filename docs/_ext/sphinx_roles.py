"""A Griffe extension for the API reference: Sphinx roles in docstrings as code.

rlocks' docstrings name other objects the reST way (``:class:`~rlocks.errors.LockLostError```,
``:meth:`rlocks.RLock.acquire```), which Markdown would print as they are. Each role becomes
a code span of the name a reader would see in Sphinx: the last part after a ``~``, else the
target without leading dots.
"""

from __future__ import annotations

import re
from typing import Any

import griffe

_ROLE = re.compile(r":(?:py:)?(?:class|meth|func|attr|mod|data|exc|obj|const):`([^`]+)`")


def _shown(match: "re.Match[str]") -> str:
    target = match.group(1)
    if target.startswith("~"):
        target = target[1:].rsplit(".", 1)[-1]
    return f"`{target.lstrip('.')}`"


class SphinxRoles(griffe.Extension):
    """Rewrite Sphinx roles into Markdown code spans once the object tree is loaded."""

    def on_object(self, *, obj: Any, **kwargs: Any) -> None:
        docstring = obj.docstring
        if docstring is not None and ":`" in docstring.value:
            docstring.value = _ROLE.sub(_shown, docstring.value)
