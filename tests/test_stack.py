"""The folder layout is the architecture: the stack reads top-down with no cycle.

    app (CLI, pipeline) -> server | benchmarks -> export -> runtime -> core (tinyt/)
                                                    export -> importers and training
                                                              (tinyt.hf, .nanogpt, .train) -> core

Every import counts, lazy ones too; `tinyt/__main__.py` is the one door from the core folder to
the top floor (scripts/stack.py prints the floors). The lab (lab/: one-off measurements run from
the checkout) stands outside the house: it may import every floor, and nothing installed imports it.
"""
import re
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "scripts"))
import stack  # noqa: E402

# Which folder may import which: each floor only those below it.
ALLOWED = {
    "tinyt": set(),
    "tinyt.runtime": {"tinyt"},
    "tinyt.export": {"tinyt", "tinyt.runtime"},
    "tinyt.benchmarks": {"tinyt", "tinyt.runtime", "tinyt.export"},
    "tinyt.server": {"tinyt", "tinyt.runtime"},
    "tinyt.app": {"tinyt", "tinyt.runtime", "tinyt.export", "tinyt.benchmarks", "tinyt.server"},
}


def test_every_folder_imports_only_the_floors_below_it():
    dirs = stack.package_dirs()
    assert set(dirs) == set(ALLOWED), "a code folder without a floor: add it to ALLOWED"
    folders = stack.folder_graph(stack.graph(), dirs)
    wrong = {f: sorted(deps - ALLOWED[f]) for f, deps in folders.items() if deps - ALLOWED[f]}
    assert not wrong, f"imports above their floor: {wrong}"
    assert not stack.cycles(folders)


def test_no_two_modules_import_each_other_round_a_circle():
    edges = {k: (v if k != stack.DOOR else set()) for k, v in stack.graph().items()}
    assert stack.cycles(edges) == []


def test_the_door_is_the_only_way_up_from_the_core():
    edges = stack.graph()
    up = {t for t in edges[stack.DOOR] if stack.folder_of(t, stack.package_dirs()) != "tinyt"}
    assert up == {"tinyt.app.cli"}


def test_the_310_reading_of_pyproject_agrees_with_tomllib(monkeypatch):
    """scripts/stack.py runs on Python 3.10, which has no tomllib."""
    want = stack.setuptools_table()
    monkeypatch.setitem(sys.modules, "tomllib", None)  # import raises ModuleNotFoundError
    got = stack.setuptools_table()
    assert got["package-dir"] == want["package-dir"] and got["packages"] == want["packages"]


def test_the_checker_sees_a_cycle_and_a_lazy_import(tmp_path):
    """The checker itself: a package whose modules import each other (one inside a function)."""
    (tmp_path / "pyproject.toml").write_text(
        '[tool.setuptools.package-dir]\n"p" = "p"\n"p.q" = "q"\n')
    (tmp_path / "p").mkdir()
    (tmp_path / "q").mkdir()
    (tmp_path / "p" / "__init__.py").write_text("")
    (tmp_path / "p" / "a.py").write_text("def f():\n    from p.q import b\n")
    (tmp_path / "q" / "__init__.py").write_text("")
    (tmp_path / "q" / "b.py").write_text("from ..a import f\n")
    dirs = stack.package_dirs(tmp_path)
    edges = stack.graph(tmp_path)
    assert edges["p.a"] == {"p.q.b"} and edges["p.q.b"] == {"p.a"}
    assert stack.cycles(edges) == [["p.a", "p.q.b"]]
    assert stack.cycles(stack.folder_graph(edges, dirs)) == [["p", "p.q"]]


def test_every_package_is_installed():
    """A folder with an __init__.py that pyproject's package list leaves out would be missing
    from the wheel while every test in the checkout passes."""
    listed = set(stack.setuptools_table()["packages"])
    found = {name for name, path in stack.modules().items() if path.name == "__init__.py"}
    assert found == listed, f"unlisted: {sorted(found - listed)}; not packages: {sorted(listed - found)}"


def test_nothing_installed_imports_the_lab():
    """The lab is not installed: a floor that imported it would break in the wheel."""
    wrong = {name: sorted(n for n in stack.absolute_imports(path)
                          if n == stack.LAB or n.startswith(stack.LAB + "."))
             for name, path in stack.modules().items()}
    assert not {k: v for k, v in wrong.items() if v}, wrong


def test_the_lab_imports_the_floors_by_their_installed_names():
    """`tinyt.benchmarks.peers`, never the folder `benchmarks.peers`: the folder name loads the
    same file a second time as another module (two copies of its tables and classes)."""
    folders = {path.name for path in stack.package_dirs().values()} - {"tinyt"}
    lab = stack.lab_modules()
    assert lab, "no lab/*.py found"
    wrong = {name: sorted(n for n in stack.absolute_imports(path) if n.split(".")[0] in folders)
             for name, path in lab.items()}
    assert not {k: v for k, v in wrong.items() if v}, wrong


def test_no_two_modules_share_a_name():
    """One name per idea: two `gqa.py` or two `web.py` make a reader open the wrong one."""
    from collections import defaultdict

    by_name = defaultdict(list)
    for module in [*stack.modules(), *stack.lab_modules()]:
        by_name[module.rpartition(".")[2]].append(module)
    twice = {k: v for k, v in by_name.items() if len(v) > 1 and k != "__main__"}
    assert not twice, twice


def test_the_tests_mirror_the_code_folders():
    """tests/<floor>/ holds the tests of that floor's folder; the whole house's checks (lint,
    the stack, packaging, the README, reliability, faults, int8 exactness) sit at the top, and
    tests/real/ takes the real models through every floor (the `real` marker); tests/lab/ holds
    the lab's."""
    floors = {Path(folder).name if name != "tinyt" else "core"
              for name, folder in stack.package_dirs().items()} | {"real", stack.LAB}
    here = {p.name for p in (ROOT / "tests").iterdir()
            if p.is_dir() and not p.name.startswith((".", "__"))}
    assert here == floors, (here, floors)


# Inside the core folder, the importers (Hugging Face, nanoGPT) and the training loop are a
# floor of their own: they read and write the core's checkpoints; the core and the runtime
# never need them (export reads tinyt.hf for the config.json its artifacts carry).
SOURCES = ("tinyt.hf", "tinyt.nanogpt", "tinyt.train", "tinyt.seq2seq_task")


def _in(module: str, names) -> bool:
    return any(module == n or module.startswith(n + ".") for n in names)


def test_the_importers_and_training_sit_above_the_core():
    edges = stack.graph()
    core = {m for m in edges if _in(m, ("tinyt",)) and not _in(m, SOURCES)
            and stack.folder_of(m, stack.package_dirs()) == "tinyt" and m != stack.DOOR}
    down = {f"{m} -> {d}" for m in core for d in edges[m] if _in(d, SOURCES)}
    assert not down, f"the core imports the importers' floor: {sorted(down)}"
    runtime = {f"{m} -> {d}" for m in edges if _in(m, ("tinyt.runtime",))
               for d in edges[m] if _in(d, SOURCES)}
    assert not runtime, runtime
    sources = {m for m in edges if _in(m, SOURCES)}
    up = {f"{m} -> {d}" for m in sources for d in edges[m]
          if stack.folder_of(d, stack.package_dirs()) != "tinyt"}
    assert not up, f"the importers' floor imports above the core: {sorted(up)}"
    assert {"tinyt.hf.families.olmo2", "tinyt.train", "tinyt.nanogpt"} <= sources


def test_docs_architecture_names_every_module():
    """docs/architecture.md draws the house module by module: a module missing from it, or
    one it names that no longer exists, fails here."""
    text = (ROOT / "docs" / "architecture.md").read_text()
    files = {str(p.relative_to(ROOT)) for p in stack.modules().values()}
    files |= {str(p.relative_to(ROOT)) for p in (ROOT / stack.LAB).glob("*.py")}
    named = set(re.findall(r"`((?:tinyt|export|runtime|server|benchmarks|app|lab)/[\w/]+\.py)`",
                           text))
    assert not files - named, f"docs/architecture.md leaves out {sorted(files - named)}"
    assert not named - files, f"docs/architecture.md names what is gone: {sorted(named - files)}"


# Ray (the `ray` extra) enters through two modules of the top floors, each importing it inside
# its functions; the core and the runtime never reach them, at any depth.
RAY_DOORS = {"tinyt.server.ray_serve", "tinyt.app.batch_ray"}


def test_only_the_ray_doors_import_ray_and_the_core_and_runtime_never_reach_them():
    named = {name for name, path in stack.modules().items()
             if any(n == "ray" or n.startswith("ray.") for n in stack.absolute_imports(path))}
    assert named == RAY_DOORS, f"Ray imported outside {sorted(RAY_DOORS)}: {sorted(named)}"
    edges, dirs = stack.graph(), stack.package_dirs()
    for start in (m for m in edges if m != stack.DOOR
                  and stack.folder_of(m, dirs) in ("tinyt", "tinyt.runtime")):
        seen, todo = set(), [start]
        while todo:
            m = todo.pop()
            if m in seen or m == stack.DOOR:
                continue
            seen.add(m)
            todo += edges.get(m, ())
        assert not seen & RAY_DOORS, f"{start} reaches {sorted(seen & RAY_DOORS)}"
