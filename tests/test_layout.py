"""The code's layout holds: imports run one way (no cycle, counting imports inside functions), the paper's
modules and models import no criterion, hub or converter, the torch-only runtime imports no fairseq, every
fairseq function the plugin replaces is replaced under ``compat/``, and no file outgrows one sitting."""

import ast
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
PACKAGES = ("fairseq_convs2s", "convs2s_runtime")
MAX_LINES = 350


def _modules():
    """{dotted module name: path} of both packages."""
    found = {}
    for package in PACKAGES:
        for path in sorted((ROOT / package).rglob("*.py")):
            parts = path.relative_to(ROOT).with_suffix("").parts
            name = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
            found[name] = path
    return found


def _imports(name: str, path: Path, known) -> set:
    """The package modules that ``name`` imports anywhere in its file (module level or inside functions)."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    targets = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            targets.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")
                anchor = anchor[: len(anchor) - node.level + 1]
                base = ".".join(anchor + ([base] if base else []))
            targets.add(base)
            targets.update(f"{base}.{alias.name}" for alias in node.names)
    return {t for t in targets if t in known and t != name}


def _graph():
    modules = _modules()
    return {name: _imports(name, path, modules) for name, path in modules.items()}


def test_no_import_cycle():
    graph = _graph()
    # a package's __init__ importing its own submodules is how registration works: leave those edges out
    edges = {n: {t for t in ts if not t.startswith(n + ".")} for n, ts in graph.items()}
    visiting, done, cycles = set(), set(), []

    def visit(node, path):
        if node in visiting:
            cycles.append(path[path.index(node) :] + [node])
            return
        if node in done:
            return
        visiting.add(node)
        for target in sorted(edges[node]):
            visit(target, path + [node])
        visiting.discard(node)
        done.add(node)

    for node in sorted(edges):
        visit(node, [])
    assert not cycles, cycles


@pytest.mark.parametrize("layer", ["fairseq_convs2s.modules", "fairseq_convs2s.models"])
def test_the_paper_layers_import_no_criterion_or_tool(layer):
    forbidden = (
        "fairseq_convs2s.criterions",
        "fairseq_convs2s.convert_fconv",
        "fairseq_convs2s.train",
        "fairseq_convs2s.budget_schedule",
        "fairseq_convs2s.export",
    )
    for name, targets in _graph().items():
        if name.startswith(layer):
            assert not [t for t in targets if t.startswith(forbidden)], name
    for name, targets in _graph().items():
        if name.startswith("fairseq_convs2s.modules"):
            assert not [t for t in targets if t.startswith("fairseq_convs2s.models")], name


# the hub and the converters are leaves: the model core reads checkpoints through models/checkpoint_args.py
LEAVES = ("fairseq_convs2s.models.pretrained", "fairseq_convs2s.models.fconv_checkpoint", "fairseq_convs2s.export")
# fairseq's API puts the hub's entry on the model class (ConvS2SModel.from_pretrained), imported inside it
HUB_ENTRY = ("fairseq_convs2s.models.convs2s", "fairseq_convs2s.models.pretrained")


def test_the_model_imports_no_hub_or_converter():
    for name, targets in _graph().items():
        if name.startswith(("fairseq_convs2s.modules", "fairseq_convs2s.models")) and name not in LEAVES:
            assert not [t for t in targets if t.startswith(LEAVES) and (name, t) != HUB_ENTRY], name


def test_compat_imports_only_fairseq_and_itself():
    """Every fix to fairseq sits below the model: compat/ imports none of the plugin's other modules (it asks a model
    it is handed, as the trainer's checkpoint check does, instead of importing one) but the plugin's exception,
    which imports nothing."""
    graph = _graph()
    assert graph["fairseq_convs2s.errors"] == set()
    for name, targets in graph.items():
        if name.startswith("fairseq_convs2s.compat"):
            allowed = ("fairseq_convs2s.compat", "fairseq_convs2s.errors")
            assert not [t for t in targets if not t.startswith(allowed)], name


def test_the_runtime_imports_neither_fairseq_nor_the_plugin():
    code = (
        "import sys, convs2s_runtime.products, convs2s_runtime.attention, convs2s_runtime.step; "
        "print(sorted(m for m in sys.modules if m.split('.')[0] in ('fairseq', 'fairseq_convs2s')))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, cwd=ROOT)
    assert out.stdout.strip() == "[]"


def test_no_file_is_over_the_limit():
    long = {
        str(p.relative_to(ROOT)): n for p in _modules().values() if (n := len(p.read_text().splitlines())) > MAX_LINES
    }
    assert not long, f"over {MAX_LINES} lines: {long}"


def _root(node) -> str:
    """``a`` of ``a.b.c`` (or of ``a.b(...).c``); "" for anything else."""
    while isinstance(node, (ast.Attribute, ast.Call, ast.Subscript)):
        node = node.func if isinstance(node, ast.Call) else node.value
    return node.id if isinstance(node, ast.Name) else ""


FAIRSEQ = ("fairseq", "fairseq_cli")


def _imported_from_fairseq(tree) -> set:
    """The names a module binds by importing from fairseq (its modules, classes and functions, whatever alias)."""
    names = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names.update(a.asname or a.name.split(".")[0] for a in node.names if a.name.split(".")[0] in FAIRSEQ)
        elif isinstance(node, ast.ImportFrom) and not node.level and node.module.split(".")[0] in FAIRSEQ:
            names.update(a.asname or a.name for a in node.names)
    return names


def test_every_change_to_fairseq_is_made_under_compat():
    """Outside ``compat/`` (and the start-up hook), nothing calls the plugin's way of replacing a fairseq function
    (``fairseq_convs2s_autoload.replace``), assigns to an attribute of anything imported from fairseq
    (``generate.main = ...``), or setattr()s one, whatever its alias; ``setattr`` goes to the package's own objects
    only."""
    for name, path in _modules().items():
        if name.startswith("fairseq_convs2s.compat"):
            continue
        tree = ast.parse(path.read_text(encoding="utf-8"))
        imported = _imported_from_fairseq(tree)
        autoload = {a.asname or a.name for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names}
        autoload &= {"fairseq_convs2s_autoload"}
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom) and node.module == "fairseq_convs2s_autoload":
                assert "replace" not in [a.name for a in node.names], (name, ast.unparse(node))
            if isinstance(node, ast.Attribute) and node.attr == "replace":
                assert _root(node.value) not in autoload, (name, ast.unparse(node))
            targets = node.targets if isinstance(node, ast.Assign) else [getattr(node, "target", None)]
            if isinstance(node, (ast.Assign, ast.AugAssign, ast.AnnAssign)):
                for target in targets:
                    assert not (isinstance(target, ast.Attribute) and _root(target) in imported), (
                        name,
                        ast.unparse(node),
                    )
            if isinstance(node, ast.Call) and getattr(node.func, "id", None) in ("setattr", "delattr"):
                owner = node.args[0]
                assert _root(owner) not in imported and ast.unparse(owner) in ("args", "self", "wrapper"), (
                    name,
                    ast.unparse(node),
                )


def _replace_calls():
    """(module, fairseq attribute name, fix name) of every ``replace(owner, name, wrapper, fix)`` under ``compat/``
    and in the start-up hook."""
    paths = {n: p for n, p in _modules().items() if n.startswith("fairseq_convs2s.compat")}
    paths["fairseq_convs2s_autoload"] = ROOT / "fairseq_convs2s_autoload.py"
    found = []
    for name, path in paths.items():
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.Call) and getattr(node.func, "id", None) == "replace":
                assert len(node.args) == 4 and all(isinstance(a, ast.Constant) for a in (node.args[1], node.args[3])), (
                    name,
                    ast.unparse(node),
                )
                found.append((name, node.args[1].value, node.args[3].value))
    return found


def test_every_fix_has_its_row_in_the_compat_table():
    """Each wrapper is marked with the name of a row of ``compat.FIXES`` (so that ``python -m
    fairseq_convs2s.compat`` lists it and ``FAIRSEQ_CONVS2S_COMPAT_OFF`` can leave it out), the fairseq function it
    replaces is named in that row's "wraps", and each row but a registration has a wrapper."""
    from fairseq_convs2s.compat import FIXES

    rows = {fix.name: fix for fix in FIXES}
    calls = _replace_calls()
    for module, attribute, fix in calls:
        if fix == "autoload":  # (the start-up hook's own, with no row: it runs before the plugin is imported)
            assert module == "fairseq_convs2s_autoload", (module, attribute)
            continue
        assert fix in rows, (module, attribute, fix)
        assert attribute in rows[fix].wraps, (module, attribute, rows[fix].wraps)
    wrapped = {fix for _, _, fix in calls}
    assert {name for name, fix in rows.items() if "a registration" not in fix.wraps} <= wrapped


def test_two_fixes_of_one_function_are_both_installed():
    """A fix is installed once per process, and a second fix of the same fairseq function still is (the mark was
    the function's: the second fix found it and silently left itself out)."""
    from types import SimpleNamespace

    from fairseq_convs2s_autoload import is_replaced, replace

    owner = SimpleNamespace(main=lambda: ["fairseq"])
    for fix in ("first", "second"):
        if not is_replaced(owner.main, fix):
            replace(owner, "main", lambda inner=owner.main, fix=fix: [fix, *inner()], fix)
        if not is_replaced(owner.main, fix):  # (installed once)
            replace(owner, "main", lambda: [], fix)
    assert owner.main() == ["second", "first", "fairseq"]
    assert is_replaced(owner.main, "first") and is_replaced(owner.main, "second")
    assert not is_replaced(owner.main, "third")
