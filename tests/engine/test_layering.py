"""The package's architecture, checked: layers, no cycle, sizes, classes, dialects, reads.

The layers, bottom up (CONTRIBUTING.md's "Architecture" draws them)::

    surfaces      admin/ cli/ management/ checks apps testing/ contrib/ the public API
    operations    operations/: start, signal, cancel, results, find, history, prune, ...
    worker        worker/: the supervisor, one module per loop, the runtime, the handoff
    definitions   registry, schedules, handles: what workflows and schedules exist, and a
                  typed handle on an instance
    storage       storage/: the Store and its parts, one package per database
    foundations   conf models signals hooks ...: Django-level, below the store
    engine        engine/: pure, no Django
    errors        exceptions: the error tree, which imports nothing

Each ``import`` inside ``selvedge_django`` is an arrow. The test fails on an arrow up
a layer, on an import cycle, on an engine module that imports Django or anything
outside the engine but the error tree; on a module longer than ``MAX_LINES`` (800; a
module past ``SEAM_LINES``, 600, is a prompt to look for a seam, and is named in
``LONG_MODULES`` with why it stays whole); on a class whose own lines plus its
in-package bases' exceed ``MAX_CLASS_LINES``, or whose in-package MRO has more than
``MAX_PUBLIC_METHODS`` public methods (a tower: take it apart into members); on a method
declared under ``TYPE_CHECKING`` in a class body (a sibling's methods: pass the
collaborator); on a dialect test (``vendor ==``, ``one_statement``,
``can_return_columns_from_insert``) or a capability branch (a condition that reads
``single_writer``, ``can_notify`` or ``connection.features``) outside the two dialect
packages; on SQL text in a function body outside the storage modules that hold
statements, and on SQL text anywhere outside ``storage/`` (migrations apart: schema
changes are theirs); and on a model manager
(``.objects``) in ``operations/`` or ``admin/``, whose reads are storage's. Imports
inside functions and under ``TYPE_CHECKING`` count: a lazy import hides a cycle from
Python, not from a reader. Modules are read with ``ast``, never imported.

``KNOWN`` lists the violations that were there when a rule was written, each with
what removes it; an entry that no longer occurs fails too, so the list only shrinks.
"""

from __future__ import annotations

import ast
import fnmatch
import pkgutil
import re
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest

PACKAGE = "selvedge_django"
ROOT = Path(__file__).resolve().parents[2] / PACKAGE
MAX_LINES = 800
SEAM_LINES = 600
MAX_CLASS_LINES = 800
MAX_PUBLIC_METHODS = 40
# Modules past SEAM_LINES, each with why it stays one module.
LONG_MODULES: dict[str, str] = {
    "selvedge_django.conf": (
        "the one settings object: each SELVEDGE key's default, validation and field side by"
        " side, so a new key is one reading of one module"
    ),
    "selvedge_django.worker.runtime": (
        "one worker's executions from lease to release, the workflow cache's parking among"
        " them; attempts and their outcomes are already members of their own"
    ),
    "selvedge_django.engine.execution": (
        "one run of workflow code against its history; wait_here came back from a module"
        " that read nine of Execution's attributes from outside"
    ),
    "selvedge_django.storage.sql": (
        "the catalogue of portable statements, each named with its comment and bound by"
        " name: one list a reader scans, as Procrastinate keeps queries.sql"
    ),
    "selvedge_django.storage.db": (
        "the plumbing every part shares (transactions, fences, history rows, wake-ups, the"
        " statement runner that binds by name); its SQLite subclass stays under the tower limit"
    ),
}
# Where a model manager may not be used: their reads and writes are storage's.
MANAGER_FREE = ("operations", "admin")

# Bottom up: a module may import its own layer and the layers below. Each entry is a
# module or a package (its prefix); every module of the package must be in one.
LAYERS: list[tuple[str, tuple[str, ...]]] = [
    ("errors", ("exceptions",)),
    ("engine", ("engine",)),
    (
        "foundations",
        (
            "conf",
            "models",  # one module per aggregate
            "flow_models",  # PriorityRank's old path, which migrations 0017 and 0018 name
            "migrations",
            "signals",
            "hooks",
            "metrics",
            "converters",
            "codecs",  # payload codecs (PAYLOAD_CODEC): encryption at rest
            "schedules.slots",  # pure rules of slots, which the store plans with
        ),
    ),
    ("storage", ("storage",)),
    ("definitions", ("registry", "schedules", "handles")),
    ("worker", ("worker",)),
    ("operations", ("operations",)),
    (
        "surfaces",
        (
            "admin",
            "cli",  # runselvedge's subcommands
            "management",
            "checks",
            "apps",
            "testing",
            "contrib",
            "workflows",
            "tasks",  # the django.tasks backend
            "streams",  # the Server-Sent Events response of a stream
            "views",  # the health view
            "urls",
        ),
    ),
]
# The package's own __init__: the public API, which re-exports every layer.
TOP = "surfaces"
# What the engine may import from outside itself: the error tree (which imports nothing).
ENGINE_MAY_IMPORT = {f"{PACKAGE}.exceptions"}
DJANGO = {"django", "asgiref"}
# The dialect packages: every module under them (prefixes, see in_dialect()).
DIALECT_MODULES = {f"{PACKAGE}.storage.postgresql", f"{PACKAGE}.storage.sqlite"}
DIALECT_NAMES = {"one_statement", "can_return_columns_from_insert"}
# What a database can do: a condition that reads one of these (or ``x.features.y``)
# branches on the database, which the dialect classes' hooks decide instead.
CAPABILITIES = {"single_writer", "can_notify"}
# Where hand-written SQL may be spelled out: the named statements and the dialects.
SQL_MODULES = {f"{PACKAGE}.storage.sql", *DIALECT_MODULES}
SQL_START = re.compile(r"\s*(SELECT|INSERT\s+INTO|UPDATE|DELETE\s+FROM|WITH|LOCK|PRAGMA)\s")

# Violations known when the test was written (patterns of keys) -> what removes them.
KNOWN: dict[str, str] = {
    "dialect: selvedge_django.checks": (
        "the SQLite-only checks (W007, and E007/W008/W009's SQLite cases) become part of"
        " the dialect Database classes' database_checks"
    ),
}


def in_dialect(name: str) -> bool:
    """Whether module ``name`` is one of the dialect packages or inside one."""
    return any(name == p or name.startswith(p + ".") for p in DIALECT_MODULES)


def in_storage(name: str) -> bool:
    """Whether module ``name`` is the storage package or inside it."""
    return name == f"{PACKAGE}.storage" or name.startswith(f"{PACKAGE}.storage.")


def known(key: str) -> bool:
    return any(fnmatch.fnmatchcase(key, pattern) for pattern in KNOWN)


@dataclass(frozen=True)
class Arrow:
    """``source`` imports ``target`` at ``path:line``."""

    source: str
    target: str
    path: str
    line: int

    def __str__(self) -> str:
        return f"{self.source} imports {self.target} ({self.path}:{self.line})"


@dataclass
class Module:
    name: str
    path: str
    is_package: bool
    tree: ast.Module
    lines: int


@dataclass
class Package:
    """The modules of the package under ``root`` and the arrows between them."""

    root: Path
    modules: dict[str, Module] = field(default_factory=dict)
    arrows: list[Arrow] = field(default_factory=list)

    def __post_init__(self) -> None:
        self.walk(self.root, PACKAGE)
        for module in self.modules.values():
            for target, line in self.imports(module):
                inner = self.owner(target)
                if inner is not None and inner != module.name:
                    self.arrows.append(Arrow(module.name, inner, module.path, line))

    def walk(self, directory: Path, name: str) -> None:
        """Parse every module under ``directory``; ``pkgutil`` lists them."""
        if (directory / "__init__.py").exists():
            self.parse(name, directory / "__init__.py", is_package=True)
        for info in pkgutil.iter_modules([str(directory)]):
            if info.ispkg:
                self.walk(directory / info.name, f"{name}.{info.name}")
            else:
                self.parse(f"{name}.{info.name}", directory / f"{info.name}.py", is_package=False)
        # pkgutil skips a folder of modules without an __init__.py (a namespace package).
        for child in sorted(directory.iterdir()):
            if (
                child.is_dir()
                and child.name.isidentifier()
                and not (child / "__init__.py").exists()
                and any(child.glob("*.py"))
            ):
                self.walk(child, f"{name}.{child.name}")

    def parse(self, name: str, path: Path, *, is_package: bool) -> None:
        text = path.read_text(encoding="utf-8")
        shown = str(path.relative_to(self.root.parent))
        tree = ast.parse(text, shown)
        self.modules[name] = Module(name, shown, is_package, tree, len(text.splitlines()))

    def imports(self, module: Module) -> Iterator[tuple[str, int]]:
        """Yield the absolute dotted name of everything ``module`` imports, with its line."""
        for node in ast.walk(module.tree):
            if isinstance(node, ast.Import):
                for alias in node.names:
                    yield alias.name, node.lineno
            elif isinstance(node, ast.ImportFrom):
                if node.level:
                    parts = module.name.split(".")
                    if not module.is_package:
                        parts = parts[:-1]
                    parts = parts[: len(parts) - node.level + 1]
                    base = ".".join([*parts, *([node.module] if node.module else [])])
                else:
                    base = node.module or ""
                for alias in node.names:
                    # "from . import x" imports the module x when there is one.
                    name = f"{base}.{alias.name}"
                    yield (name if name in self.modules else base), node.lineno

    def owner(self, target: str) -> str | None:
        """The module of the package that ``target`` (a module, or a name in one) is."""
        while target not in self.modules:
            if "." not in target:
                return None
            target = target.rsplit(".", 1)[0]
        return target

    def violations(self) -> dict[str, str]:
        """Every violation, keyed as KNOWN is, with the message that explains it."""
        found: dict[str, str] = {}
        for name in self.modules:
            if layer(name) is None:
                found[f"layer: {name}"] = f"{name} is in no layer: add it to LAYERS"
        for arrow in self.arrows:
            source, target = layer(arrow.source), layer(arrow.target)
            if source is None or target is None:
                continue
            if rank(target) > rank(source):
                found[f"upward: {arrow.source} -> {arrow.target}"] = (
                    f"{arrow}: {source} imports {target}, a layer above it"
                )
            if source == "engine" and target != "engine" and arrow.target not in ENGINE_MAY_IMPORT:
                found[f"engine: {arrow.source} -> {arrow.target}"] = (
                    f"{arrow}: the engine imports nothing outside itself but the error tree"
                )
        for module in self.modules.values():
            if layer(module.name) == "engine":
                for target, line in self.imports(module):
                    if target.split(".")[0] in DJANGO:
                        found[f"django: {module.name}"] = (
                            f"{module.path}:{line}: the engine imports {target}"
                        )
            if ".migrations." not in module.name:
                if module.lines > MAX_LINES:
                    found[f"size: {module.name}"] = (
                        f"{module.path} has {module.lines} lines, more than {MAX_LINES}"
                    )
                elif module.lines > SEAM_LINES and module.name not in LONG_MODULES:
                    found[f"seam: {module.name}"] = (
                        f"{module.path} has {module.lines} lines, more than {SEAM_LINES}: look"
                        " for a seam, or name it in LONG_MODULES with why it stays whole"
                    )
            lines = sorted(set(dialect_tests(module.tree)))
            if lines and not in_dialect(module.name):
                found[f"dialect: {module.name}"] = (
                    f"{module.path}, line {', '.join(map(str, lines))}: a dialect test or"
                    " capability branch outside storage/postgresql/ and storage/sqlite/ (the"
                    " classes of each database override what differs)"
                )
            lines = sorted(set(sql_text(module.tree)))
            if lines and not in_storage(module.name) and ".migrations" not in module.name:
                found[f"sql text: {module.name}"] = (
                    f"{module.path}, line {', '.join(map(str, lines))}: SQL text outside"
                    " storage/ (reads and writes are the store's: add one to a part)"
                )
            lines = sorted(set(sql_in_functions(module.tree)))
            if lines and module.name not in SQL_MODULES and not in_dialect(module.name):
                found[f"sql: {module.name}"] = (
                    f"{module.path}, line {', '.join(map(str, lines))}: SQL text in a function"
                    " body (name the statement in storage/sql.py)"
                )
        found.update(class_violations(self))
        found.update(manager_violations(self))
        for members, loop in self.cycles():
            chain = "".join(f"\n    {arrow}" for arrow in loop)
            found[f"cycle: {' '.join(members)}"] = (
                f"import cycle among {', '.join(members)}; one loop:{chain}"
            )
        return found

    def cycles(self) -> list[tuple[list[str], list[Arrow]]]:
        """Each set of modules that import each other in a loop, and its shortest loop."""
        graph: dict[str, list[Arrow]] = {name: [] for name in self.modules}
        for arrow in self.arrows:
            graph[arrow.source].append(arrow)
        index: dict[str, int] = {}
        low: dict[str, int] = {}
        stack: list[str] = []
        found: list[set[str]] = []

        def visit(name: str) -> None:  # Tarjan's strongly connected components
            index[name] = low[name] = len(index)
            stack.append(name)
            for arrow in graph[name]:
                if arrow.target not in index:
                    visit(arrow.target)
                    low[name] = min(low[name], low[arrow.target])
                elif arrow.target in stack:
                    low[name] = min(low[name], index[arrow.target])
            if low[name] == index[name]:
                component = {stack.pop()}
                while name not in component:
                    component.add(stack.pop())
                if len(component) > 1:
                    found.append(component)

        for name in sorted(graph):
            if name not in index:
                visit(name)
        return [(sorted(c), shortest_loop(graph, min(c), c)) for c in found]


# -- classes: size with in-package bases, public methods along the MRO, stubs -------------


@dataclass(frozen=True)
class ClassInfo:
    module: str
    name: str
    path: str
    node: ast.ClassDef

    @property
    def lines(self) -> int:
        return (self.node.end_lineno or self.node.lineno) - self.node.lineno + 1

    @property
    def public_methods(self) -> set[str]:
        return {
            item.name
            for item in self.node.body
            if isinstance(item, ast.FunctionDef | ast.AsyncFunctionDef)
            and not item.name.startswith("_")
        }


def classes(package: Package) -> dict[str, ClassInfo]:
    """Every top-level class of the package, keyed ``module.Class``."""
    found: dict[str, ClassInfo] = {}
    for module in package.modules.values():
        for node in module.tree.body:
            if isinstance(node, ast.ClassDef):
                found[f"{module.name}.{node.name}"] = ClassInfo(
                    module.name, node.name, module.path, node
                )
    return found


def imported_names(package: Package, module: Module) -> dict[str, str]:
    """The names ``module`` binds by ``from ... import``, to the dotted name they import."""
    names: dict[str, str] = {}
    for node in ast.walk(module.tree):
        if isinstance(node, ast.ImportFrom):
            if node.level:
                parts = module.name.split(".")
                if not module.is_package:
                    parts = parts[:-1]
                parts = parts[: len(parts) - node.level + 1]
                base = ".".join([*parts, *([node.module] if node.module else [])])
            else:
                base = node.module or ""
            for alias in node.names:
                names[alias.asname or alias.name] = f"{base}.{alias.name}"
    return names


def resolve(package: Package, known: dict[str, ClassInfo], key: str) -> str | None:
    """The class a dotted name stands for, following re-exports of package modules."""
    seen: set[str] = set()
    while key not in known and key not in seen:
        seen.add(key)
        module_name, _, name = key.rpartition(".")
        module = package.modules.get(module_name)
        if module is None:
            return None
        target = imported_names(package, module).get(name)
        if target is None:
            return None
        key = target
    return key if key in known else None


def in_package_bases(package: Package, known: dict[str, ClassInfo], key: str) -> list[str]:
    """``key``'s bases defined in the package, transitively, each once, nearest first."""
    order: list[str] = []
    todo = [key]
    while todo:
        current = todo.pop(0)
        info = known[current]
        names = imported_names(package, package.modules[info.module])
        for base in info.node.bases:
            text = ast.unparse(base)
            head = text.split(".")[0]
            # A base named through an import, or one defined in the same module.
            dotted = names[head] + text[len(head) :] if head in names else f"{info.module}.{text}"
            found = resolve(package, known, dotted)
            if found is not None and found not in order and found != key:
                order.append(found)
                todo.append(found)
    return order


def class_violations(package: Package) -> dict[str, str]:
    found: dict[str, str] = {}
    known = classes(package)
    for key, info in known.items():
        bases = in_package_bases(package, known, key)
        lines = info.lines + sum(known[base].lines for base in bases)
        if lines > MAX_CLASS_LINES:
            found[f"class size: {key}"] = (
                f"{info.path}: {info.name} has {lines} lines with its in-package bases"
                f" ({', '.join(known[b].name for b in bases) or 'none'}), more than"
                f" {MAX_CLASS_LINES}: take it apart into members"
            )
        methods = set(info.public_methods)
        for base in bases:
            methods |= known[base].public_methods
        if len(methods) > MAX_PUBLIC_METHODS:
            found[f"class methods: {key}"] = (
                f"{info.path}: {info.name} has {len(methods)} public methods along its"
                f" in-package MRO, more than {MAX_PUBLIC_METHODS}"
            )
        for item in info.node.body:
            if (
                isinstance(item, ast.If)
                and "TYPE_CHECKING" in ast.unparse(item.test)
                and any(isinstance(s, ast.FunctionDef | ast.AsyncFunctionDef) for s in item.body)
            ):
                found[f"stub: {key}"] = (
                    f"{info.path}:{item.lineno}: {info.name} declares methods under"
                    " TYPE_CHECKING (a sibling's methods): pass the collaborator instead"
                )
    return found


def manager_uses(module: Module) -> list[int]:
    return sorted(
        {
            node.lineno
            for node in ast.walk(module.tree)
            if isinstance(node, ast.Attribute) and node.attr in ("objects", "_default_manager")
        }
    )


def manager_violations(package: Package) -> dict[str, str]:
    found: dict[str, str] = {}
    for module in package.modules.values():
        relative = module.name.removeprefix(PACKAGE + ".")
        if relative.split(".")[0] not in MANAGER_FREE:
            continue
        lines = manager_uses(module)
        if lines:
            found[f"manager: {module.name}"] = (
                f"{module.path}, line {', '.join(map(str, lines))}: a model manager outside"
                " storage (a read belongs in storage's reads)"
            )
    return found


def shortest_loop(graph: dict[str, list[Arrow]], start: str, within: set[str]) -> list[Arrow]:
    """The shortest chain of imports from ``start`` back to it, inside ``within``."""
    paths: dict[str, list[Arrow]] = {start: []}
    queue = [start]
    while queue:
        name = queue.pop(0)
        for arrow in sorted(graph[name], key=lambda a: (a.target, a.line)):
            if arrow.target == start:
                return [*paths[name], arrow]
            if arrow.target in within and arrow.target not in paths:
                paths[arrow.target] = [*paths[name], arrow]
                queue.append(arrow.target)
    raise AssertionError(f"no loop through {start}")


def layer(name: str) -> str | None:
    """The layer of the module ``name``: its longest matching entry in LAYERS."""
    relative = name.removeprefix(PACKAGE).removeprefix(".")
    if not relative:
        return TOP
    best: tuple[int, str] | None = None
    for label, prefixes in LAYERS:
        for prefix in prefixes:
            if (relative == prefix or relative.startswith(f"{prefix}.")) and (
                best is None or len(prefix) > best[0]
            ):
                best = (len(prefix), label)
    return None if best is None else best[1]


def rank(label: str) -> int:
    return [name for name, _ in LAYERS].index(label)


def dialect_tests(tree: ast.AST) -> Iterator[int]:
    """Lines that test the database: ``x.vendor == ...``, ``one_statement``, features,
    and conditions that read a capability (``if store.single_writer``)."""
    for node in ast.walk(tree):
        if isinstance(node, (ast.If, ast.IfExp, ast.While)):
            for part in ast.walk(node.test):
                if isinstance(part, ast.Attribute) and (
                    part.attr in CAPABILITIES
                    or (isinstance(part.value, ast.Attribute) and part.value.attr == "features")
                ):
                    yield part.lineno
        if isinstance(node, ast.Compare) and any(
            isinstance(op, (ast.Eq, ast.NotEq)) for op in node.ops
        ):
            if any(
                (isinstance(side, ast.Attribute) and side.attr == "vendor")
                or (isinstance(side, ast.Name) and side.id == "vendor")
                for side in (node.left, *node.comparators)
            ):
                yield node.lineno
        elif (isinstance(node, ast.Attribute) and node.attr in DIALECT_NAMES) or (
            isinstance(node, (ast.FunctionDef, ast.Name))
            and getattr(node, "name", getattr(node, "id", "")) in DIALECT_NAMES
        ):
            yield node.lineno


def sql_in_functions(tree: ast.AST) -> Iterator[int]:
    """Lines in function bodies where a string or f-string starts an SQL statement."""
    for function in ast.walk(tree):
        if isinstance(function, (ast.FunctionDef, ast.AsyncFunctionDef)):
            yield from sql_text(function)


def sql_text(tree: ast.AST) -> Iterator[int]:
    """Lines under ``tree`` where a string or f-string starts an SQL statement."""
    for node in ast.walk(tree):
        if isinstance(node, ast.JoinedStr) and node.values:
            head = node.values[0]
            text = head.value if isinstance(head, ast.Constant) else ""
        elif isinstance(node, ast.Constant):
            text = node.value
        else:
            continue
        if isinstance(text, str) and SQL_START.match(text):
            yield node.lineno


PACKAGE_NOW = Package(ROOT)
VIOLATIONS = PACKAGE_NOW.violations()


def check(*kinds: str) -> None:
    """Fail with every violation of these kinds that KNOWN does not list, one a line."""
    problems = sorted(
        message
        for key, message in VIOLATIONS.items()
        if key.split(":", 1)[0] in kinds and not known(key)
    )
    if problems:
        pytest.fail("\n".join(problems), pytrace=False)


def test_every_module_is_in_a_layer() -> None:
    assert len(PACKAGE_NOW.modules) > 50
    check("layer")


def test_no_import_points_up_a_layer() -> None:
    check("upward")


def test_the_engine_imports_no_django_and_nothing_outside_itself() -> None:
    check("engine", "django")


def test_no_import_cycle() -> None:
    check("cycle")


def test_no_module_is_longer_than_800_lines() -> None:
    check("size")


def test_every_module_past_600_lines_says_why_it_stays_whole() -> None:
    check("seam")
    gone = [name for name in LONG_MODULES if name not in PACKAGE_NOW.modules]
    shorter = [
        name
        for name, module in PACKAGE_NOW.modules.items()
        if name in LONG_MODULES and module.lines <= SEAM_LINES
    ]
    assert not gone and not shorter, f"remove from LONG_MODULES: {gone + shorter}"


def test_no_class_is_a_tower() -> None:
    check("class size", "class methods")


def test_no_method_stub_under_type_checking_in_a_class() -> None:
    check("stub")


def test_operations_and_admin_use_no_model_manager() -> None:
    check("manager")


def test_dialect_tests_only_in_the_dialect_modules() -> None:
    check("dialect")


def test_sql_only_in_the_statement_and_dialect_modules() -> None:
    check("sql")


def test_sql_text_only_under_storage() -> None:
    check("sql text")


def test_every_known_violation_still_occurs() -> None:
    """A violation fixed leaves KNOWN, so that it cannot come back unnoticed.

    An entry about modules that are gone is fixed by their removal: it is skipped.
    """
    fixed = []
    for pattern in KNOWN:
        names = re.findall(r"selvedge_django[\w.]*", pattern.replace("*", ""))
        if not any(fnmatch.fnmatchcase(key, pattern) for key in VIOLATIONS) and all(
            any(module.startswith(name) for module in PACKAGE_NOW.modules) for name in names
        ):
            fixed.append(pattern)
    if fixed:
        pytest.fail("fixed, remove from KNOWN: " + ", ".join(fixed), pytrace=False)


def test_the_checks_find_each_kind_of_violation(tmp_path: Path) -> None:
    """On a small package made to break every rule, each check reports it and where."""
    root = tmp_path / PACKAGE
    files = {
        "__init__.py": "",
        "exceptions.py": "",
        "engine/commands.py": "from . import context\nimport django.db\n",
        "engine/context.py": "def f():\n    from .commands import x\n",
        "engine/codec.py": "from ..models import Thing\nfrom .. import exceptions\n",
        "models.py": "",
        "storage/__init__.py": "",
        "storage/store.py": (
            "from ..worker import handoff\n"
            "def claim(self):\n"
            "    if self.vendor == 'postgresql':\n"
            "        return self.execute(f'SELECT 1 FROM t WHERE id = {self.id}')\n"
        ),
        "storage/sqlite.py": "def claim(self):\n    return self.vendor == 'sqlite'\n",
        "worker/__init__.py": "",
        "worker/handoff.py": "x = 1\n" * (MAX_LINES + 1),
        "worker/loops.py": "x = 1\n" * (SEAM_LINES + 1),
        "storage/base.py": "class Base:\n"
        + "".join(f"    def m{n}(self): ...\n" for n in range(30))
        + "    x = 1\n" * 500,
        "storage/tower.py": "from .base import Base\nclass Tower(Base):\n"
        + "".join(f"    def t{n}(self): ...\n" for n in range(11))
        + "    x = 1\n" * 300
        + "    if TYPE_CHECKING:\n        def sibling(self): ...\n",
        "admin/__init__.py": "",
        "admin/views.py": "def page(request):\n    return Thing.objects.all()\n",
        "worker/outcomes.py": "def group(store):\n    return 1 if store.single_writer else 0\n",
        "operations/find.py": 'PAGE = "SELECT id FROM t"\n',
        "migrations/0001_initial.py": 'FILL = "UPDATE t SET x = 1"\n',
    }
    for name, text in files.items():
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        (root / name).write_text(text)
    found = Package(root).violations()
    assert set(found) == {
        "cycle: selvedge_django.engine.commands selvedge_django.engine.context",
        "django: selvedge_django.engine.commands",
        "engine: selvedge_django.engine.codec -> selvedge_django.models",
        "upward: selvedge_django.engine.codec -> selvedge_django.models",
        "upward: selvedge_django.storage.store -> selvedge_django.worker.handoff",
        "dialect: selvedge_django.storage.store",
        "sql: selvedge_django.storage.store",
        "size: selvedge_django.worker.handoff",
        "seam: selvedge_django.worker.loops",
        "class size: selvedge_django.storage.tower.Tower",
        "class methods: selvedge_django.storage.tower.Tower",
        "stub: selvedge_django.storage.tower.Tower",
        "manager: selvedge_django.admin.views",
        "dialect: selvedge_django.worker.outcomes",
        "sql text: selvedge_django.operations.find",
    }
    assert "(Base)" in found["class size: selvedge_django.storage.tower.Tower"]
    assert "41 public methods" in found["class methods: selvedge_django.storage.tower.Tower"]
    assert found["cycle: selvedge_django.engine.commands selvedge_django.engine.context"] == (
        "import cycle among selvedge_django.engine.commands, selvedge_django.engine.context;"
        " one loop:"
        "\n    selvedge_django.engine.commands imports selvedge_django.engine.context"
        " (selvedge_django/engine/commands.py:1)"
        "\n    selvedge_django.engine.context imports selvedge_django.engine.commands"
        " (selvedge_django/engine/context.py:2)"
    )
    assert found["upward: selvedge_django.storage.store -> selvedge_django.worker.handoff"] == (
        "selvedge_django.storage.store imports selvedge_django.worker.handoff"
        " (selvedge_django/storage/store.py:1): storage imports worker, a layer above it"
    )
    assert "line 3:" in found["dialect: selvedge_django.storage.store"]
    assert "line 4:" in found["sql: selvedge_django.storage.store"]
    assert "line 2:" in found["dialect: selvedge_django.worker.outcomes"]
    assert "line 1:" in found["sql text: selvedge_django.operations.find"]


@pytest.mark.parametrize(
    ("name", "expected"),
    [
        ("selvedge_django", "surfaces"),
        ("selvedge_django.engine.replay", "engine"),
        ("selvedge_django.storage.postgresql", "storage"),
        ("selvedge_django.schedules.slots", "foundations"),
        ("selvedge_django.schedules", "definitions"),
        ("selvedge_django.schedules.definitions", "definitions"),
        ("selvedge_django.operations.schedules", "operations"),
        ("selvedge_django.admin.instances", "surfaces"),
    ],
)
def test_a_module_is_in_the_layer_of_its_longest_entry(name: str, expected: str) -> None:
    assert layer(name) == expected
