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
def test_the_paper_layers_import_no_criterion_hub_or_converter(layer):
    forbidden = ("fairseq_convs2s.criterions", "fairseq_convs2s.convert_fconv", "fairseq_convs2s.train")
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
    it is handed, as the trainer's checkpoint check does, instead of importing one)."""
    for name, targets in _graph().items():
        if name.startswith("fairseq_convs2s.compat"):
            assert not [t for t in targets if not t.startswith("fairseq_convs2s.compat")], name


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


def test_every_fairseq_function_is_replaced_under_compat():
    """The plugin's one way of replacing a fairseq function (``fairseq_convs2s_autoload.replace``) is called only
    under ``compat/`` (and by the start-up hook itself), and nothing else assigns to a module or class attribute
    outside the package's own objects."""
    for name, path in _modules().items():
        tree = ast.parse(path.read_text(encoding="utf-8"))
        calls = [
            n
            for n in ast.walk(tree)
            if isinstance(n, ast.Call) and getattr(n.func, "id", None) in ("replace", "setattr")
        ]
        if name.startswith("fairseq_convs2s.compat"):
            continue
        replaced = [ast.unparse(c) for c in calls if c.func.id == "replace"]
        assert not replaced, (name, replaced)
        for call in (c for c in calls if c.func.id == "setattr"):
            owner = ast.unparse(call.args[0])
            assert owner in ("args", "self", "wrapper"), (name, ast.unparse(call))
