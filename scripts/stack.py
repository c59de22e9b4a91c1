"""The import graph of tinyt's code folders: floors, folder cycles and file circles.

    python scripts/stack.py          # prints each folder's floor and any cycle; exit 1 if one

Every `import` counts, also those inside functions (a lazy import is still a dependency).
The folder → package mapping is pyproject's package-dir table.
"""
from __future__ import annotations

import ast
import re
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
DOOR = "tinyt.__main__"  # the one module allowed to import the top floor from the core folder
LAB = "lab"  # one-off scripts run from the checkout: outside the package, on no floor


def setuptools_table(root: Path = ROOT) -> dict:
    """pyproject's [tool.setuptools] with its package-dir table (tomllib from Python 3.11; on
    3.10 the two entries this reads, which pyproject spells one per line)."""
    text = (root / "pyproject.toml").read_text()
    try:
        import tomllib
    except ModuleNotFoundError:  # Python 3.10
        section = re.search(r"^\[tool\.setuptools\.package-dir\]\n(.*?)(?=^\[|\Z)", text,
                            re.M | re.S)
        dirs = dict(re.findall(r'^"([^"]+)"\s*=\s*"([^"]+)"', section.group(1) if section else "",
                               re.M))
        listed = re.search(r"^packages\s*=\s*\[(.*?)\]", text, re.M | re.S)
        return {"package-dir": dirs,
                "packages": re.findall(r'"([^"]+)"', listed.group(1) if listed else "")}
    return tomllib.loads(text)["tool"]["setuptools"]


def package_dirs(root: Path = ROOT) -> dict[str, Path]:
    """Package name -> folder, from pyproject's [tool.setuptools.package-dir]."""
    return {name: root / folder for name, folder in setuptools_table(root)["package-dir"].items()}


def modules(root: Path = ROOT) -> dict[str, Path]:
    """Dotted module name -> file, for every .py file of every mapped package."""
    found: dict[str, Path] = {}
    dirs = package_dirs(root)
    for package, folder in dirs.items():
        for path in sorted(folder.rglob("*.py")):
            rel = path.relative_to(folder).with_suffix("")
            parts = list(rel.parts)
            # a sub-folder that is itself mapped elsewhere belongs to that package
            inner = (folder / Path(*parts[: i + 1]) for i in range(len(parts) - 1))
            if any(p in dirs.values() for p in inner):
                continue
            if parts[-1] == "__init__":
                parts = parts[:-1]
            found[".".join([package, *parts])] = path
    return found


def lab_modules(root: Path = ROOT) -> dict[str, Path]:
    """Dotted module name -> file, for the lab's scripts (lab/*.py, not installed)."""
    return {LAB if p.stem == "__init__" else f"{LAB}.{p.stem}": p
            for p in sorted((root / LAB).glob("*.py"))}


def absolute_imports(path: Path) -> set[str]:
    """The dotted names a file imports absolutely (relative imports stay in their package)."""
    out: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            out.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and not node.level and node.module:
            out.update([node.module, *(f"{node.module}.{a.name}" for a in node.names)])
    return out


def imports(name: str, path: Path, known: dict[str, Path]) -> set[str]:
    """The known modules that `name` imports (absolute and relative, at any depth)."""
    tree = ast.parse(path.read_text(), str(path))
    is_package = path.name == "__init__.py"
    here = name if is_package else name.rpartition(".")[0]
    out: set[str] = set()

    def add(target: str) -> None:
        while target and target not in known:
            target = target.rpartition(".")[0]
        if target and target != name:
            out.add(target)

    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                add(alias.name)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parent = here.split(".")
                parent = parent[: len(parent) - (node.level - 1)]
                base = ".".join(parent + ([base] if base else []))
            for alias in node.names:
                full = f"{base}.{alias.name}"
                add(full if full in known else base)
    return out


def folder_of(module: str, dirs: dict[str, Path]) -> str:
    """The mapped package a module lives in (the longest matching package name)."""
    best = max((p for p in dirs if module == p or module.startswith(p + ".")), key=len)
    return best


def graph(root: Path = ROOT) -> dict[str, set[str]]:
    known = modules(root)
    return {name: imports(name, path, known) for name, path in known.items()}


def cycles(edges: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components with more than one node (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on: set[str] = set()
    out: list[list[str]] = []
    counter = [0]
    sys.setrecursionlimit(10000)

    def visit(v: str) -> None:
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on.add(v)
        for w in edges.get(v, ()):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                out.append(sorted(comp))

    for v in sorted(edges):
        if v not in index:
            visit(v)
    return out


def folder_graph(edges: dict[str, set[str]], dirs: dict[str, Path]) -> dict[str, set[str]]:
    out: dict[str, set[str]] = {p: set() for p in dirs}
    for src, targets in edges.items():
        if src == DOOR:
            continue
        a = folder_of(src, dirs)
        for t in targets:
            b = folder_of(t, dirs)
            if a != b:
                out[a].add(b)
    return out


def floors(folders: dict[str, set[str]]) -> dict[str, int]:
    """Floor 0 imports no other folder; a folder's floor is one above the highest it imports
    (folders in a cycle are left out)."""
    level: dict[str, int] = {}
    remaining = dict(folders)
    while remaining:
        ready = [f for f, deps in remaining.items() if all(d in level for d in deps - {f})]
        if not ready:
            break
        for f in ready:
            level[f] = 1 + max((level[d] for d in remaining[f] - {f}), default=-1)
            del remaining[f]
    return level


def main() -> int:
    dirs = package_dirs()
    edges = graph()
    file_edges = {k: (v if k != DOOR else set()) for k, v in edges.items()}
    folders = folder_graph(edges, dirs)
    bad = 0
    for comp in cycles(folders):
        print("folder cycle:", " <-> ".join(comp))
        bad += 1
    for comp in cycles(file_edges):
        print("file circle:", " <-> ".join(comp))
        bad += 1
    for folder, level in sorted(floors(folders).items(), key=lambda kv: (-kv[1], kv[0])):
        deps = ", ".join(sorted(folders[folder])) or "-"
        print(f"floor {level}: {folder:18s} ({dirs[folder].relative_to(ROOT)}/) imports {deps}")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
