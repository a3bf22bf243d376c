"""Every public function and class of jaxdm/harness has a docstring (issue 39 §5): module-level
functions and classes, and the public methods and properties of public classes, whose names
do not start with an underscore (stdlib ``ast``, no import of the package)."""
from __future__ import annotations

import ast
from pathlib import Path

HARNESS = Path(__file__).resolve().parents[2] / "jaxdm" / "harness"
DEFS = (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)


def undocumented(source: str, where: str = "<source>") -> tuple[list[str], int]:
    """(``where:line name`` of each public definition without a docstring, how many public
    definitions there are) in ``source``."""
    missing, total = [], 0

    def visit(body, prefix: str) -> None:
        nonlocal total
        for node in body:
            if not isinstance(node, DEFS) or node.name.startswith("_"):
                continue
            total += 1
            if ast.get_docstring(node) is None:
                missing.append(f"{where}:{node.lineno} {prefix}{node.name}")
            if isinstance(node, ast.ClassDef):
                visit(node.body, f"{prefix}{node.name}.")

    visit(ast.parse(source).body, "")
    return missing, total


def test_the_counter_finds_what_lacks_a_docstring():
    src = ('def f():\n    """Doc."""\n\ndef g():\n    pass\n\ndef _h():\n    pass\n\n'
           'class C:\n    """Doc."""\n    def m(self): ...\n    def _p(self): ...\n'
           '    @property\n    def q(self):\n        """Doc."""\n')
    missing, total = undocumented(src)
    assert missing == ["<source>:4 g", "<source>:12 C.m"]
    assert total == 5   # f, g, C, C.m, C.q


def test_every_public_harness_definition_has_a_docstring():
    missing, total = [], 0
    for path in sorted(HARNESS.glob("*.py")):
        m, t = undocumented(path.read_text(encoding="utf-8"), path.name)
        missing += m
        total += t
    assert total > 100   # the harness's public functions, classes and methods were read
    assert not missing, f"{len(missing)} of {total} lack a docstring: " + "; ".join(missing)
