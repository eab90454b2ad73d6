"""Nothing in the pipeline, nor in its tests' own process, reads a pickle: the SpecForge export is written with
torch.save (a pickle, by that trainer's choice) and read back only by the drivers in the trainer's own environment."""
from __future__ import annotations

import ast
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
TRAINER_DRIVERS = REPO / "tests" / "exports" / "drivers"  # run with .venv-specforge / .venv-speculators only
PICKLE_MODULES = {"pickle", "cPickle", "_pickle", "dill", "cloudpickle", "joblib"}
LOADERS = {("torch", "load"), ("pickle", "load"), ("pickle", "loads"), ("pickle", "Unpickler"), ("numpy", "load")}


def _problems(path: Path, root: Path = REPO) -> list[str]:
    problems, where = [], path.relative_to(root)
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"), str(path))):
        names = []
        if isinstance(node, ast.Import):
            names = [alias.name.split(".")[0] for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module:
            names = [node.module.split(".")[0]]
        problems += [f"{where}:{node.lineno}: imports {n}" for n in names if n in PICKLE_MODULES]
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) \
                and isinstance(node.func.value, ast.Name):
            module = {"np": "numpy"}.get(node.func.value.id, node.func.value.id)
            if (module, node.func.attr) in LOADERS:
                problems.append(f"{where}:{node.lineno}: calls {module}.{node.func.attr}")
    return problems


def test_no_module_of_the_pipeline_or_its_tests_reads_a_pickle():
    files = [p for root in ("pipeline", "tests", "bench") for p in (REPO / root).rglob("*.py")
             if TRAINER_DRIVERS not in p.parents]
    assert len(files) > 50
    assert [problem for f in files for problem in _problems(f)] == []


def test_the_check_sees_a_pickle_read(tmp_path):
    bad = tmp_path / "probe.py"
    bad.write_text("import torch\nx = torch.load('f.pt')\nfrom pickle import loads\n")
    assert sorted(p.split(": ", 1)[1] for p in _problems(bad, tmp_path)) == ["calls torch.load", "imports pickle"]
