"""Cancellation scopes: which commands a cancel reaches.

Every context issues its commands in one scope. ``ctx.with_cancel()`` opens a
child scope, ``ctx.detached()`` a parentless one that ignores the durable cancel
request (for cleanup). A scope only remembers its commands and whether it was
cancelled; the commands module records the cancellation.
"""

from __future__ import annotations

__all__ = ["Scope"]


class Scope:
    """A cancellation scope: attached to the workflow's request unless detached."""

    def __init__(self, parent: Scope | None, detached: bool) -> None:
        self.parent = parent
        self.detached = detached
        self.cancelled = False
        self.children: list[Scope] = []
        self.commands: list[tuple[str, str, str]] = []  # (key, command, child id)
        if parent is not None:
            parent.children.append(self)

    def locally_cancelled(self) -> bool:
        """True when this scope or an enclosing one was cancelled by workflow code."""
        scope: Scope | None = self
        while scope is not None:
            if scope.cancelled:
                return True
            scope = scope.parent
        return False

    def attached(self) -> bool:
        """True when the durable cancel request reaches this scope."""
        scope: Scope | None = self
        while scope is not None:
            if scope.detached:
                return False
            scope = scope.parent
        return True

    def subtree(self) -> list[Scope]:
        """This scope and its attached (non-detached) descendants."""
        found = [self]
        for child in self.children:
            if not child.detached:
                found.extend(child.subtree())
        return found
