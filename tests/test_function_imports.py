"""Function-level imports in jaxdm/ stay few (issue 39 §4): each one left is there because a
heavy or optional dependency (scipy, matplotlib, transformers, orbax, bm25s, gguf, jinja2,
httpx, tqdm, or JAX in a module that is light without it) should load only when the function
runs, and says why where that is not obvious. Counted with stdlib ``ast``, no import of the
package."""
from __future__ import annotations

import ast
from pathlib import Path

JAXDM = Path(__file__).resolve().parents[1] / "jaxdm"
MAX_FUNCTION_IMPORTS = 43   # 279 before issue 39's clean-up


def function_imports(source: str, where: str = "<source>") -> list[str]:
    """``where:line`` of every import statement (``import a, b`` is one) inside a function or
    method body of ``source``, nested functions included; a class body is not a function."""
    out: list[str] = []

    def walk(node: ast.AST, in_function: bool) -> None:
        for child in ast.iter_child_nodes(node):
            if in_function and isinstance(child, (ast.Import, ast.ImportFrom)):
                out.append(f"{where}:{child.lineno}")
            walk(child, in_function or isinstance(child, (ast.FunctionDef,
                                                          ast.AsyncFunctionDef)))

    walk(ast.parse(source), False)
    return out


def test_the_counter_finds_function_level_imports():
    src = ("import os\n\nclass C:\n    import re\n    def m(self):\n        import json\n"
           "        from . import sib\n\ndef f():\n    def g():\n        import a, b\n"
           "    if True:\n        from x import y\n    return g\n")
    assert function_imports(src) == ["<source>:6", "<source>:7", "<source>:11", "<source>:13"]


def test_jaxdm_has_few_function_level_imports():
    paths = sorted(JAXDM.rglob("*.py"))
    assert len(paths) > 100   # the package was read
    found = [hit for p in paths for hit in function_imports(p.read_text(encoding="utf-8"),
                                                            str(p.relative_to(JAXDM.parent)))]
    assert len(found) <= MAX_FUNCTION_IMPORTS, (
        f"{len(found)} function-level imports in jaxdm/ (at most {MAX_FUNCTION_IMPORTS}): "
        "import at module level unless a heavy or optional dependency must load lazily (and "
        "say why in a comment): " + ", ".join(found))
