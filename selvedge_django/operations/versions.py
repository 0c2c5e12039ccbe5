"""What code the running instances were started under, and which patches they passed.

``running_versions()`` answers the question a deploy asks before it removes old
code: per workflow, how many running instances each recorded ``CODE_VERSION``
has, and how many running instances hold the marker of each patch (those that
took the new path). A patch may be deprecated once every running instance of
its workflow holds its marker or started under code that has the patch; old
code may be removed once no running instance has its version.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

from .base import read_store

__all__ = ["MAX_VERSION_ROWS", "WorkflowVersions", "running_versions"]

# At most this many (workflow, version) and (workflow, patch) groups are read.
MAX_VERSION_ROWS = 10_000


@dataclass
class WorkflowVersions:
    """The running instances of one workflow, by code version and by patch marker."""

    workflow_name: str
    running: int = 0
    versions: dict[str | None, int] = field(default_factory=dict)
    patches: dict[str, int] = field(default_factory=dict)

    def to_json(self) -> dict[str, Any]:
        return {
            "workflow_name": self.workflow_name,
            "running": self.running,
            "versions": [{"code_version": v, "running": n} for v, n in self.versions.items()],
            "patches": [
                {"patch_id": p, "with_marker": n, "without_marker": self.running - n}
                for p, n in self.patches.items()
            ],
        }


def _patch_id(data: str | None) -> str | None:
    try:
        value = json.loads(data) if data is not None else None
    except ValueError:
        return None
    return value if isinstance(value, str) else None


def running_versions(workflow_name: str | None = None) -> list[WorkflowVersions]:
    """Count running instances per workflow, per code version and per patch marker.

    Two grouped reads, each bounded by :data:`MAX_VERSION_ROWS` groups, both on
    partial indexes (running instances by workflow and version; patch markers).
    """
    reads = read_store().operator_reads
    found: dict[str, WorkflowVersions] = {}
    for name, version, count in reads.running_version_counts(workflow_name, MAX_VERSION_ROWS):
        entry = found.setdefault(name, WorkflowVersions(name))
        entry.versions[version] = count
        entry.running += count
    for name, data, count in reads.running_patch_counts(workflow_name, MAX_VERSION_ROWS):
        patch_id = _patch_id(data)
        if patch_id is not None and name in found:
            found[name].patches[patch_id] = found[name].patches.get(patch_id, 0) + count
    for entry in found.values():
        # NULL sorts first on SQLite and last on PostgreSQL: unversioned last on both.
        entry.versions = dict(sorted(entry.versions.items(), key=lambda i: (i[0] is None, i[0])))
    return [found[name] for name in sorted(found)]
