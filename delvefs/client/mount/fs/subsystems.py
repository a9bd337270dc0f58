"""The core's subsystems: parts that the widest parts are given together.

``Shape`` is what the mount shows — the inode table, the views' catalog, the tree and the
layout by properties; ``Writing`` is what happens to written files — their state (dirty,
journal, upload queue), their uploads, the queued DELETEs, their tags and metadata,
directory publishes.
They are plain records built once by ``FileSystem``: a part given one unpacks the parts it
calls (no part reaches through a subsystem to change another's fields:
tests/unit/test_ownership.py).
"""
from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Shape:
    table: object      # InodeTable
    catalog: object    # ViewCatalog
    tree: object       # Tree
    layout: object     # PropertyLayout


@dataclass(frozen=True)
class Writing:
    written: object    # WrittenFiles
    uploads: object    # Uploads
    deletes: object    # DeleteQueue
    properties: object  # Properties
    publisher: object  # Publisher
