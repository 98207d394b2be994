"""The command line stays small: no function over 60 lines, no module over 450.

Run as a script to list the long functions anywhere (it reports, it does not judge):

    python tests/cli/test_code_size.py src/statekeeper [LIMIT]
"""

from __future__ import annotations

import ast
import sys
from pathlib import Path

CLI = Path(__file__).parents[2] / "src" / "statekeeper" / "cli"
SERVER = CLI.parent / "server"  # the same rules for the HTTP server
MAX_FUNCTION_LINES = 60
MAX_MODULE_LINES = 450


def long_functions(root: Path, limit: int = MAX_FUNCTION_LINES) -> list[str]:
    """``path:Qualified.name:first-last (lines)`` for each function under ``root`` whose
    body spans more than ``limit`` lines (``end_lineno - lineno``, decorators excluded)."""
    found: list[str] = []

    def visit(node: ast.AST, path: Path, prefix: str) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, ast.FunctionDef | ast.AsyncFunctionDef):
                name = prefix + child.name
                span = (child.end_lineno or child.lineno) - child.lineno
                if span > limit:
                    found.append(f"{path}:{name}:{child.lineno}-{child.end_lineno} ({span})")
                visit(child, path, name + ".")
            elif isinstance(child, ast.ClassDef):
                visit(child, path, f"{prefix}{child.name}.")
            else:
                visit(child, path, prefix)

    for path in sorted(root.rglob("*.py")):
        visit(ast.parse(path.read_text(encoding="utf-8")), path, "")
    return found


def test_no_cli_function_is_over_60_lines() -> None:
    assert long_functions(CLI) == []
    assert long_functions(SERVER) == []


def test_no_cli_module_is_over_450_lines() -> None:
    files = [*CLI.glob("*.py"), *SERVER.rglob("*.py")]
    sizes = {str(p): len(p.read_text(encoding="utf-8").splitlines()) for p in files}
    assert str(CLI / "runs.py") in sizes
    assert {name: lines for name, lines in sizes.items() if lines > MAX_MODULE_LINES} == {}


def test_long_functions_finds_nested_and_method_bodies(tmp_path: Path) -> None:
    body = "\n".join(f"        x{i} = {i}" for i in range(5))
    (tmp_path / "m.py").write_text(
        f"class A:\n    def long(self):\n{body}\n\n    def short(self):\n        pass\n",
        encoding="utf-8",
    )
    assert long_functions(tmp_path, limit=4) == [f"{tmp_path / 'm.py'}:A.long:2-7 (5)"]
    assert long_functions(tmp_path, limit=5) == []


if __name__ == "__main__":
    limit = int(sys.argv[2]) if len(sys.argv) > 2 else MAX_FUNCTION_LINES
    print("\n".join(long_functions(Path(sys.argv[1]), limit)))
