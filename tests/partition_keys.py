"""Which rows a statement addresses: by instance, by queue, at a queue's head, or across.

The scaling plan (docs/scaling.md) ends with the hot tables hash-partitioned by
``instance_id`` and, past one server, distributed by it (Citus). Both only pay when
every hot statement names the instance (or the batch of instances) whose rows it
touches: a partitioned table then prunes to one partition, a distributed one routes
to one shard. This module reads a statement's text and says, for every reference to
a hot table in it, how that reference finds its rows:

``instance``
    a condition on the reference's ``instance_id`` (``= value``, ``IN (values)``,
    ``IN (SELECT ...)``, ``= ANY(...)``, or equal to a column of another row: a join
    or a correlation, which stays within one instance per row), or an insert whose
    column list carries ``instance_id``;
``queue``
    a condition on ``queue`` or ``concurrency_key``: the flow-control reads of one
    queue or one key, which span instances by design (and an insert of a per-queue
    row, whose column list carries ``queue``);
``head``
    no key, but bounded (``LIMIT``, or the body of ``EXISTS``): the head of one of the
    engine's queue indexes (ready instances, expired leases, queued tasks, due
    timers, deadlines). Only the operations listed as queue readers may do this;
``parent``
    ``parent_instance_id``: the children of one instance. Each child is a row of its own
    instance, so a table partitioned by ``instance_id`` finds them in every partition;
``id``
    the row's own surrogate ``id`` and nothing else: one row, but a table partitioned
    by ``instance_id`` has to look for it in every partition;
``scan``
    none of these: the statement reads or writes rows of many instances.

It is a reader of this engine's SQL (portable and PostgreSQL statements, and what
Django's ORM writes for the engine), not a SQL parser: parentheses make scopes,
``UNION`` splits a scope, ``WHERE`` and ``ON`` hold the conditions, ``AND`` and ``OR``
combine them. ``tests/integration/test_partition_ready.py`` runs the hot paths, reads
every statement they send and checks the result; its self-tests show what it rejects.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from dataclasses import dataclass, field

__all__ = ["Access", "accesses", "classify_condition"]

# Words that end a FROM item's alias, or a condition, at the same depth.
_CLAUSE_END = re.compile(
    r"\b(where|order by|group by|limit|returning|for (?:no key )?update|for share"
    r"|on conflict|union|join|left join|inner join|set|select|values|using|on)\b"
)
_REFERENCE = re.compile(r"\b(from|join|update|into)\s+([a-z_][a-z0-9_]*)\b")
_ALIAS = re.compile(r"^\s+(?:as\s+)?([a-z_][a-z0-9_]*)\b")
_NOT_ALIAS = {
    "where",
    "on",
    "set",
    "join",
    "left",
    "inner",
    "order",
    "limit",
    "for",
    "group",
    "union",
    "returning",
    "using",
    "values",
    "select",
    "default",
    "indexed",
    "not",
}
_SUBQUERY = re.compile(r"^\s*(select|with|values)\b")
_GROUP = re.compile(r"^\s*\(#(\d+)\)\s*$")


@dataclass
class Scope:
    """One parenthesised part of a statement: its text, each child shown as ``(#n)``."""

    text: str
    children: list[Scope] = field(default_factory=list)
    bounded: bool = False  # the body of an EXISTS: one row is enough

    def is_subquery(self) -> bool:
        return _SUBQUERY.match(self.text) is not None


@dataclass(frozen=True)
class Access:
    """One reference to a table in a statement, and how it addresses its rows."""

    table: str
    alias: str
    kind: str  # "instance", "queue", "head", "parent", "id" or "scan"
    clause: str  # the condition (or column list) the decision was read from


def normalise(sql: str) -> str:
    """Lower case, no identifier quotes, ``%s`` for every parameter (a named mark's
    parentheses are not a scope), one space between words."""
    text = re.sub(r"%\([a-z0-9_]+\)s", "%s", sql.replace('"', ""), flags=re.IGNORECASE)
    return re.sub(r"\s+", " ", text).strip().lower()


def parse(sql: str) -> Scope:
    """The statement as a tree of scopes, split at its parentheses (outside literals)."""
    stack: list[tuple[list[str], list[Scope]]] = [([], [])]
    quoted = False
    for char in normalise(sql):
        if char == "'":
            quoted = not quoted
        if quoted or char not in "()":
            stack[-1][0].append(char)
        elif char == "(":
            stack.append(([], []))
        else:
            chars, children = stack.pop()
            parent_chars, parent_children = stack[-1]
            scope = Scope("".join(chars).strip(), children)
            scope.bounded = "".join(parent_chars).rstrip().endswith("exists")
            parent_chars.append(f"(#{len(parent_children)})")
            parent_children.append(scope)
    chars, children = stack[0]
    return Scope("".join(chars).strip(), children)


def _walk(scope: Scope) -> Iterator[Scope]:
    yield scope
    for child in scope.children:
        yield from _walk(child)


def _split_top(text: str, word: str) -> list[str]:
    """``text`` split at ``word`` (``and``, ``or``, ``union all``); scopes are already
    masked, so every occurrence is at this depth."""
    return [part.strip() for part in re.split(rf"\b{word}\b", text)]


def _condition_after(text: str, start: int) -> str:
    """The condition that starts at ``start``: up to the next clause word."""
    end = _CLAUSE_END.search(text, start)
    return text[start : end.start() if end else len(text)].strip()


def classify_condition(condition: str, alias: str, table: str, scope: Scope) -> str:
    """How ``condition`` (masked text of ``scope``) addresses the rows of ``alias``.

    An OR keys its rows only when every branch does; an AND when one term does.
    """
    if not condition:
        return "scan"
    branches = _split_top(condition, "or")
    kinds = [_branch_kind(branch, alias, table, scope) for branch in branches]
    return min(kinds, key=_RANK.__getitem__)  # the weakest branch decides


_RANK = {"instance": 4, "queue": 3, "parent": 2, "id": 1, "scan": 0}


def _branch_kind(branch: str, alias: str, table: str, scope: Scope) -> str:
    best = "scan"
    for term in _split_top(branch, "and"):
        kind = _term_kind(term, alias, table, scope)
        if _RANK[kind] > _RANK[best]:
            best = kind
    return best


def _term_kind(term: str, alias: str, table: str, scope: Scope) -> str:
    group = _GROUP.match(term)
    if group:
        child = scope.children[int(group.group(1))]
        if child.is_subquery():
            return "scan"
        return classify_condition(child.text, alias, table, child)
    if term.startswith("not "):
        return "scan"
    column = rf"(?:(?:{re.escape(alias)}|{re.escape(table)})\.)?"
    if re.match(rf"^{column}instance_id\s*(=|in\b)", term) or re.search(
        rf"=\s*{column}instance_id$", term
    ):
        return "instance"
    if re.match(rf"^{column}(queue|concurrency_key)\s*(=|in\b)", term):
        return "queue"
    if re.match(rf"^{column}parent_instance_id\s*(=|in\b)", term):
        return "parent"
    if re.match(rf"^{column}id\s*(=|in\b)", term):
        return "id"
    return "scan"


def _references(part: str) -> Iterator[tuple[str, str, str, int]]:
    """(verb, table, alias, end of the reference) of each table named in ``part``."""
    for match in _REFERENCE.finditer(part):
        verb, table = match.groups()
        alias = table
        rest = part[match.end() :]
        named = _ALIAS.match(rest)
        if named and named.group(1) not in _NOT_ALIAS:
            alias = named.group(1)
        yield verb, table, alias, match.end()


def _where(part: str) -> str:
    found = re.search(r"\bwhere\b", part)
    return _condition_after(part, found.end()) if found else ""


def accesses(sql: str, tables: set[str]) -> list[Access]:
    """Every reference to one of ``tables`` in ``sql``, with how it addresses its rows."""
    found: list[Access] = []
    for scope in _walk(parse(sql)):
        for part in _split_top(scope.text, "union all|union"):
            bounded = scope.bounded or re.search(r"\blimit\b", part) is not None
            for verb, table, alias, end in _references(part):
                if table not in tables:
                    continue
                found.append(_access(scope, part, verb, table, alias, end, bounded))
    return found


def _access(
    scope: Scope, part: str, verb: str, table: str, alias: str, end: int, bounded: bool
) -> Access:
    if verb == "into":
        columns = re.match(r"^\s*\(#(\d+)\)", part[end:])
        listed = scope.children[int(columns.group(1))].text if columns else ""
        if re.search(r"\binstance_id\b", listed):
            return Access(table, alias, "instance", listed)
        if re.search(r"\bqueue\b", listed):  # a per-queue row (a rate-limited queue's claim)
            return Access(table, alias, "queue", listed)
        return Access(table, alias, "scan", listed)
    conditions = [_where(part)]
    if verb == "join":
        on = re.search(r"\bon\b", part[end:])
        if on:
            conditions.append(_condition_after(part, end + on.end()))
    best = "scan"
    for condition in conditions:
        kind = classify_condition(condition, alias, table, scope)
        if _RANK[kind] > _RANK[best]:
            best = kind
    if best == "scan" and bounded:
        best = "head"
    return Access(table, alias, best, " | ".join(c for c in conditions if c))
