"""fastlight's import graph: no cycle, nothing imported from a higher floor, nothing from ``benchmarks``.

Every module under ``fastlight/`` is parsed with :mod:`ast`; every ``import`` counts, at module level,
inside functions and under ``if TYPE_CHECKING`` alike (a function-level import is how a cycle hides:
``checkpoints -> modules.rl_module -> modules.init_from -> checkpoints`` once did). Importing
``fastlight.a.b`` also runs ``fastlight/a/__init__.py``, so that package is an edge too, unless the
importer lives inside it (the package is then already being initialised).

The floors follow DESIGN.md's "Shape of the code" (data walks one way, top to bottom), bottom first.
A module may import from its own floor and the floors below; same-floor edges are allowed, cycles never:

0. ``procs`` (process helpers), ``extras`` (optional dependencies), ``rollout`` (the batch contract),
   ``losses`` and ``stats`` (pure functions), ``checkpoints``, ``checkpoint_link`` and ``log_writes`` (file
   I/O only), ``class_paths`` (import paths), ``lightning_compat`` and ``jsonargparse_compat`` (every
   private API of those libraries): they
   import nothing of fastlight but each other.
1. ``advantages`` (over losses), ``models`` (policies; over extras), ``weights`` (publishing a version;
   its shared lock is in procs), ``metrics`` (over rollout), ``ranks`` (what a multi-rank run needs
   beyond Lightning: heartbeats, launchers, SLURM's requeue, the rollback point; over lightning_compat).
2. ``envs`` (instructions use the models' text encoders) and ``inference`` (serves a model, takes its
   weights, starts its process through procs). Neither knows about samplers.
3. ``sampling``: what runs inside a sampler (the collector steps envs, the sampler loop); it may use the
   inference worker's sampler-side proxy, and never imports the trainer's side (``fleet``).
4. ``fleet``: the trainer's side of the samplers (the local pool owns the inference client; ``fleet.ray``
   is the Ray fleet, the only place Ray is imported).
5. ``data`` (the RolloutDataModule over the sampler fleet) and ``evaluation`` (plays envs, reuses the
   sampler's observation helpers).
6. ``modules`` (LightningModules; they read data's protocols; ``modules.loading`` rebuilds one from a
   checkpoint) and ``callbacks`` (over data's protocols and metrics).
7. ``vla``: VLA policies over Hugging Face models and their modules (the only place ``transformers`` and
   ``peft`` are imported).
8. The commands and public names: ``cli`` (with ``cli_callbacks``, ``cli_output``, ``cli_parser``),
   ``evaluate``, ``plot``, ``__main__`` and the package ``__init__``.

A module missing from the floors fails the test until it is placed. Walls on top of the floors
(:data:`WALLS`): ``ray`` is imported only under ``fleet/ray/``, ``transformers`` and ``peft`` only under
``vla/``, and ``sampling`` never imports ``fleet``. No module is over
:data:`MAX_LINES` lines. The checkers themselves are tested on tiny fake packages with a cycle, an
upward import, a third-party import outside its folder and a long module, so a green run means something.
"""

from __future__ import annotations

import ast
from dataclasses import dataclass
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = "fastlight"

#: Bottom to top; a name is the first component after ``fastlight.`` ("" is ``fastlight/__init__.py``).
FLOORS: list[tuple[str, ...]] = [
    (
        "procs",
        "extras",
        "rollout",
        "losses",
        "stats",
        "safe_files",
        "checkpoints",
        "checkpoint_link",
        "class_paths",
        "rank_state",
        "lightning_compat",
        "jsonargparse_compat",
        "log_writes",
    ),
    ("advantages", "models", "weights", "metrics", "ranks"),
    ("envs", "inference"),
    ("sampling",),
    ("fleet",),
    ("data", "evaluation"),
    ("modules", "callbacks"),
    ("vla",),
    ("cli", "cli_callbacks", "cli_defaults", "cli_output", "cli_parser", "evaluate", "plot", "__main__", ""),
]


#: Third-party packages and the only modules (a dotted name covers the modules under it) that import them.
WALLS: dict[str, tuple[str, ...]] = {
    "ray": ("fastlight.fleet.ray",),
    "transformers": ("fastlight.vla",),
    "peft": ("fastlight.vla",),
}
#: ``(importer, imported)`` package pairs that must have no edge, whatever the floors say.
FORBIDDEN: list[tuple[str, str]] = [("fastlight.sampling", "fastlight.fleet")]
#: The most lines a module of fastlight may have (DESIGN.md, Rules of the house).
MAX_LINES = 450


@dataclass(frozen=True)
class Edge:
    """``src`` imports ``dst`` (both dotted module names), at ``where`` (``path:line``)."""

    src: str
    dst: str
    where: str


def module_files(root: Path, package: str) -> dict[str, Path]:
    """Every module of ``package`` (a folder under ``root``) by dotted name; a package is its ``__init__``."""
    out = {}
    for path in sorted((root / package).rglob("*.py")):
        parts = list(path.relative_to(root).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts = parts[:-1]
        out[".".join(parts)] = path
    return out


def _imported_names(tree: ast.AST, name: str, is_package: bool) -> list[tuple[str, int, str | None]]:
    """``(absolute module, line, imported attribute or None)`` of every import in ``tree``."""
    here = name.split(".") if is_package else name.split(".")[:-1]
    out: list[tuple[str, int, str | None]] = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            out += [(a.name, node.lineno, None) for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:  # relative: from the importer's package, up level - 1
                anchor = here[: len(here) - node.level + 1]
                base = ".".join([*anchor, base] if base else anchor)
            out += [(base, node.lineno, a.name) for a in node.names]
    return out


def import_graph(root: Path, package: str) -> tuple[dict[str, list[Edge]], list[str], list[str]]:
    """``(edges by importer, imports of modules that do not exist, imports of benchmarks)``; the last two
    as ``"path:line: importer imports name"`` lines."""
    files = module_files(root, package)
    edges: dict[str, list[Edge]] = {m: [] for m in files}
    unknown, benchmarks = [], []
    for name, path in files.items():
        tree = ast.parse(path.read_text(), filename=str(path))
        for target, line, attr in _imported_names(tree, name, path.name == "__init__.py"):
            where = f"{path.relative_to(root)}:{line}"
            if target.split(".")[0] == "benchmarks":
                benchmarks.append(f"{where}: {name} imports {target}")
            if target.split(".")[0] != package:
                continue
            dst = f"{target}.{attr}" if attr and f"{target}.{attr}" in files else target
            if dst not in files:
                unknown.append(f"{where}: {name} imports {dst}, which is not a module of {package}")
                continue
            parents = [".".join(dst.split(".")[:i]) for i in range(2, dst.count(".") + 1)]
            for d in [dst, *(p for p in parents if not (name + ".").startswith(p + "."))]:
                if d != name:
                    edges[name].append(Edge(name, d, where))
    return edges, unknown, benchmarks


def _literal_import(node: ast.AST) -> str | None:
    """The module of ``import_extra("m", ...)`` or ``importlib.import_module("m")`` with a literal name:
    optional dependencies are imported that way, so they count as imports too."""
    if not (isinstance(node, ast.Call) and node.args and isinstance(node.args[0], ast.Constant)):
        return None
    func = node.func
    name = func.id if isinstance(func, ast.Name) else func.attr if isinstance(func, ast.Attribute) else ""
    arg = node.args[0].value
    return arg if name in ("import_extra", "import_module") and isinstance(arg, str) else None


def third_party_imports(root: Path, package: str) -> list[tuple[str, str, str]]:
    """``(importer, top-level package, "path:line")`` of every import of a package other than ``package``
    (statements at any depth, and literal :func:`_literal_import` calls)."""
    out = []
    for name, path in module_files(root, package).items():
        tree = ast.parse(path.read_text(), filename=str(path))
        found = [(t, line) for t, line, _ in _imported_names(tree, name, path.name == "__init__.py")]
        found += [(m, n.lineno) for n in ast.walk(tree) if (m := _literal_import(n)) is not None]
        for target, line in found:
            top = target.split(".")[0]
            if top and top != package:
                out.append((name, top, f"{path.relative_to(root)}:{line}"))
    return out


def _under(module: str, prefix: str) -> bool:
    return module == prefix or module.startswith(prefix + ".")


def walls_broken(
    imports: list[tuple[str, str, str]], edges: dict[str, list[Edge]], walls: dict[str, tuple[str, ...]],
    forbidden: list[tuple[str, str]],
) -> list[str]:  # fmt: skip
    """Every import through a wall, as ``"path:line: importer imports name"`` lines."""
    out = [
        f"{where}: {src} imports {top} (only {', '.join(walls[top])} may)"
        for src, top, where in imports
        if top in walls and not any(_under(src, ok) for ok in walls[top])
    ]
    for src, out_edges in sorted(edges.items()):
        for e in out_edges:
            for low, high in forbidden:
                if _under(src, low) and _under(e.dst, high):
                    out.append(f"{e.where}: {src} imports {e.dst} ({low} never imports {high})")
    return out


def long_modules(root: Path, package: str, limit: int) -> list[str]:
    """``"path: n lines"`` of every module of ``package`` over ``limit`` lines, longest first."""
    sizes = [(len(p.read_text().splitlines()), p) for p in module_files(root, package).values()]
    return [f"{p.relative_to(root)}: {n} lines" for n, p in sorted(sizes, key=lambda x: -x[0]) if n > limit]


def find_cycle(edges: dict[str, list[Edge]]) -> list[Edge] | None:
    """One import cycle as its edges (``a -> b -> ... -> a``), or None (iterative depth-first search)."""
    state: dict[str, int] = {}  # 1: on the current path, 2: done
    for start in sorted(edges):
        if state.get(start):
            continue
        path: list[Edge] = []
        stack = [(start, iter(edges.get(start, [])))]
        state[start] = 1
        while stack:
            node, children = stack[-1]
            edge = next(children, None)
            if edge is None:
                state[node] = 2
                stack.pop()
                if path:
                    path.pop()
                continue
            if state.get(edge.dst) == 1:  # back to a module on the path: the cycle is the path from it
                cycle = [*path, edge]
                first = next(i for i, e in enumerate(cycle) if e.src == edge.dst)
                return cycle[first:]
            if not state.get(edge.dst):
                state[edge.dst] = 1
                path.append(edge)
                stack.append((edge.dst, iter(edges.get(edge.dst, []))))
    return None


def floor_of(module: str, floors: list[tuple[str, ...]], package: str = PACKAGE) -> int | None:
    """The floor of ``module`` (by its first component under ``package``), None where unplaced."""
    parts = module.split(".")
    top = parts[1] if len(parts) > 1 and parts[0] == package else ""
    return next((i for i, names in enumerate(floors) if top in names), None)


def upward_edges(
    edges: dict[str, list[Edge]], floors: list[tuple[str, ...]], package: str = PACKAGE
) -> list[str]:
    """Every import of a higher floor, as ``"path:line: a (floor i) imports b (floor j)"``."""
    out = []
    for src, out_edges in sorted(edges.items()):
        for e in out_edges:
            i, j = floor_of(src, floors, package), floor_of(e.dst, floors, package)
            if i is not None and j is not None and j > i:
                out.append(f"{e.where}: {src} (floor {i}) imports {e.dst} (floor {j})")
    return out


def _show(cycle: list[Edge]) -> str:
    return " -> ".join([cycle[0].src, *(f"{e.dst} ({e.where})" for e in cycle)])


# --------------------------------------------------------------------------- fastlight itself
@pytest.fixture(scope="module")
def graph() -> tuple[dict[str, list[Edge]], list[str], list[str]]:
    return import_graph(ROOT, PACKAGE)


def test_every_module_has_a_floor(graph):
    edges, _, _ = graph
    assert len(edges) > 50  # the parser found the package
    unplaced = sorted(m for m in edges if floor_of(m, FLOORS) is None)
    assert not unplaced, f"modules on no floor (add them to FLOORS in {Path(__file__).name}): {unplaced}"


def test_every_fastlight_import_names_a_module(graph):
    _, unknown, _ = graph
    assert not unknown, "imports of missing fastlight modules:\n" + "\n".join(unknown)


def test_no_import_cycle(graph):
    edges, _, _ = graph
    cycle = find_cycle(edges)
    assert cycle is None, f"import cycle: {_show(cycle)}"


def test_nothing_imports_a_higher_floor(graph):
    edges, _, _ = graph
    up = upward_edges(edges, FLOORS)
    assert not up, "imports against the layering (DESIGN.md, Shape of the code):\n" + "\n".join(up)


def test_nothing_in_fastlight_imports_benchmarks(graph):
    _, _, benchmarks = graph
    assert not benchmarks, "fastlight/ must not import benchmarks/:\n" + "\n".join(benchmarks)


def test_procs_is_the_ground_floor(graph):
    edges, _, _ = graph
    assert [e.dst for e in edges[f"{PACKAGE}.procs"]] == []
    users = {e.src for out in edges.values() for e in out if e.dst == f"{PACKAGE}.procs"}
    expected = {"fastlight.sampling.worker", "fastlight.inference.server", "fastlight.weights.shared_memory"}
    assert expected <= users


def test_ray_transformers_and_peft_stay_behind_their_walls(graph):
    edges, _, _ = graph
    imports = third_party_imports(ROOT, PACKAGE)
    assert {"ray", "transformers", "peft"} <= {top for _, top, _ in imports}  # the walk sees them
    broken = walls_broken(imports, edges, WALLS, FORBIDDEN)
    assert not broken, "imports through a wall (DESIGN.md, Shape of the code):\n" + "\n".join(broken)


def test_no_module_is_over_the_line_limit():
    long = long_modules(ROOT, PACKAGE, MAX_LINES)
    assert not long, f"modules over {MAX_LINES} lines (split them by concept):\n" + "\n".join(long)


# --------------------------------------------------------------------------- the checker can fail
def _fake_package(tmp_path: Path) -> Path:
    """``pkg``: low (floor 0) imports high (floor 1) inside a function, high imports low at the top,
    ``sub.a`` imports ``sub.b`` relatively and ``b`` imports ``benchmarks`` and a missing module."""
    files = {
        "pkg/__init__.py": "",
        "pkg/low.py": "def f():\n    from pkg.high import g\n    return g\n",
        "pkg/high.py": "import pkg.low\n\n\ndef g():\n    return pkg.low\n",
        "pkg/sub/__init__.py": "",
        "pkg/sub/a.py": "from . import b\nfrom .b import x\n",
        "pkg/sub/b.py": "x = 1\nif x:\n    import benchmarks.sync\n    from pkg.missing import q\n",
    }
    for rel, text in files.items():
        (tmp_path / rel).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / rel).write_text(text)
    return tmp_path


def test_the_checker_finds_a_cycle_an_upward_edge_benchmarks_and_a_missing_module(tmp_path):
    edges, unknown, benchmarks = import_graph(_fake_package(tmp_path), "pkg")
    cycle = find_cycle(edges)
    assert cycle is not None
    assert {(e.src, e.dst) for e in cycle} == {("pkg.low", "pkg.high"), ("pkg.high", "pkg.low")}
    assert "pkg/low.py:2" in _show(cycle) and "pkg/high.py:1" in _show(cycle)
    floors = [("low", "sub"), ("high", "")]
    up = upward_edges(edges, floors, "pkg")
    assert up == ["pkg/low.py:2: pkg.low (floor 0) imports pkg.high (floor 1)"]
    # Relative imports resolve to the sibling module (once per statement), not to the package.
    assert [(e.dst, e.where) for e in edges["pkg.sub.a"]] == [
        ("pkg.sub.b", "pkg/sub/a.py:1"),
        ("pkg.sub.b", "pkg/sub/a.py:2"),
    ]
    assert benchmarks == ["pkg/sub/b.py:3: pkg.sub.b imports benchmarks.sync"]
    assert unknown == ["pkg/sub/b.py:4: pkg.sub.b imports pkg.missing, which is not a module of pkg"]


def test_the_checker_counts_a_package_init_and_passes_a_clean_graph(tmp_path):
    (tmp_path / "pkg" / "sub").mkdir(parents=True)
    (tmp_path / "pkg" / "__init__.py").write_text("")
    (tmp_path / "pkg" / "sub" / "__init__.py").write_text("from pkg.sub.inner import y\n")
    (tmp_path / "pkg" / "sub" / "inner.py").write_text("from pkg.base import z\ny = z\n")
    (tmp_path / "pkg" / "base.py").write_text("z = 0\n")
    (tmp_path / "pkg" / "top.py").write_text("from pkg.sub.inner import y\n")
    edges, unknown, benchmarks = import_graph(tmp_path, "pkg")
    # top -> sub.inner runs sub/__init__.py too; inner -> sub is not an edge (its own package).
    assert sorted(e.dst for e in edges["pkg.top"]) == ["pkg.sub", "pkg.sub.inner"]
    assert [e.dst for e in edges["pkg.sub.inner"]] == ["pkg.base"]
    assert find_cycle(edges) is None and not unknown and not benchmarks
    assert upward_edges(edges, [("base",), ("sub",), ("top",)], "pkg") == []
    # The same graph with base above sub: inner's import of base is named as going up.
    assert upward_edges(edges, [("sub",), ("base",), ("top",)], "pkg") == [
        "pkg/sub/inner.py:1: pkg.sub.inner (floor 0) imports pkg.base (floor 1)"
    ]


def test_the_wall_checker_names_each_import_through_a_wall_and_a_long_module(tmp_path):
    """``pkg.lib`` imports ray inside a function and through ``import_extra``, ``pkg.io.a`` imports
    ``pkg.net``; ``pkg.net.ray`` may import ray, and ``pkg.lib`` is one line over the limit."""
    files = {
        "pkg/__init__.py": "",
        "pkg/net/__init__.py": "",
        "pkg/net/ray/__init__.py": "import ray\n",
        "pkg/net/ray/actor.py": "from ray.util import placement_group\n",
        "pkg/io/__init__.py": "",
        "pkg/io/a.py": "def f():\n    from pkg.net import ray\n    return ray\n",
        "pkg/lib.py": "def f():\n    import ray.util\n    return import_extra('ray', extra='ray')\n"
        + "x = 1\n" * 8,
    }
    for rel, text in files.items():
        (tmp_path / rel).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / rel).write_text(text)
    edges, _, _ = import_graph(tmp_path, "pkg")
    imports = third_party_imports(tmp_path, "pkg")
    walls = {"ray": ("pkg.net.ray",)}
    assert walls_broken(imports, edges, walls, [("pkg.io", "pkg.net")]) == [
        "pkg/lib.py:2: pkg.lib imports ray (only pkg.net.ray may)",
        "pkg/lib.py:3: pkg.lib imports ray (only pkg.net.ray may)",
        "pkg/io/a.py:2: pkg.io.a imports pkg.net.ray (pkg.io never imports pkg.net)",
        "pkg/io/a.py:2: pkg.io.a imports pkg.net (pkg.io never imports pkg.net)",
    ]
    assert walls_broken(imports, edges, {"ray": ("pkg",)}, []) == []
    assert long_modules(tmp_path, "pkg", 10) == ["pkg/lib.py: 11 lines"]
    assert long_modules(tmp_path, "pkg", 11) == []
