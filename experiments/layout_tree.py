"""Print the package tree of ``hpp/`` with one line per module: its job (the first sentence of its docstring).

docs/LAYOUT.md's tree is this output (``--write`` puts it there; ``experiments/run_all.py`` does too)::

    python experiments/layout_tree.py            # the tree, as Markdown (a fenced block)
    python experiments/layout_tree.py --write    # rewrite the tree in docs/LAYOUT.md
    python experiments/layout_tree.py --check    # exit 1 if a module has no docstring

Lines of code per module are printed beside each name (a size, not a rule: modules end where their concept does).
"""

from __future__ import annotations

import argparse
import ast
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent / "hpp"
LAYOUT = ROOT.parent / "docs" / "LAYOUT.md"
START, END = "<!-- tree:start -->", "<!-- tree:end -->"


def first_sentence(doc: str | None, width: int = 100) -> str:
    """The docstring's first sentence on one line, cut at ``width`` characters."""
    if not doc:
        return ""
    text = " ".join(doc.strip().split("\n\n")[0].split())
    cut = text.find(". ")
    text = text if cut < 0 else text[:cut + 1]
    return text if len(text) <= width else text[:width - 3].rstrip() + "..."


def tree(root: Path = ROOT) -> tuple[list[str], list[str]]:
    """(lines of the tree, problems: modules without a docstring)."""
    lines, problems = [], []

    def walk(folder: Path, depth: int) -> None:
        pad = "    " * depth
        init = folder / "__init__.py"
        doc = ast.get_docstring(ast.parse(init.read_text())) if init.exists() else None
        head = f"{pad}{folder.name}/"
        lines.append(f"{head:<36}{first_sentence(doc)}")
        for p in sorted(folder.glob("*.py")):
            if p.name == "__init__.py":
                continue
            src = p.read_text()
            n = src.count("\n")
            doc = ast.get_docstring(ast.parse(src))
            if not doc:
                problems.append(f"{p.relative_to(root.parent)}: no module docstring")
            name = f"{pad}    {p.name} ({n})"
            lines.append(f"{name:<36}{first_sentence(doc)}")
        for sub in sorted(d for d in folder.iterdir() if d.is_dir() and (d / "__init__.py").exists()):
            walk(sub, depth + 1)

    walk(root, 0)
    return lines, problems


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="exit 1 on a module without docstring")
    parser.add_argument("--write", action="store_true", help=f"rewrite the tree in {LAYOUT.relative_to(ROOT.parent)}")
    args = parser.parse_args(argv)
    lines, problems = tree()
    if args.check:
        for p in problems:
            print(p)
        return 1 if problems else 0
    block = "```text\n" + "\n".join(lines) + "\n```"
    if args.write:
        write_tree(block)
        return 0
    print(block)
    return 0


def write_tree(block: str, path: Path = LAYOUT) -> None:
    """Replace the text between the tree markers of ``path`` with ``block`` (written atomically).

    Raises
    ------
    SystemExit
        ``path`` lacks the markers (one line naming the file and the fix, exit 2).
    """
    from hpp.fileio import write_atomic

    text = path.read_text()
    if START not in text or END not in text:
        print(f"layout_tree: error: {path}: no {START} ... {END} markers. Fix: put them where the tree goes",
              file=sys.stderr)
        raise SystemExit(2)
    head, rest = text.split(START, 1)
    write_atomic(path, f"{head}{START}\n{block}\n{END}{rest.split(END, 1)[1]}")


if __name__ == "__main__":
    sys.exit(main())
