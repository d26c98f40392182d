"""Rewrite the tree's citations of the spec into the one form docs/spec.md asks for.

    python docs/cite.py [--check] [--root DIR]

The form (docs/spec.md, "Citing it"): ``spec §4``, ``spec §4.6``, ``spec A5``, ``spec R3``,
several references after one ``spec`` (``spec §2-§5 and §8``, ``spec A2, A5``). Python comments
and strings, shell scripts and TOML get that plain text; Markdown outside code gets each
reference as a link to its anchor, relative to the page (``[spec A5](docs/spec.md#a5)`` in
README.md). Old forms rewritten: ``SPEC section 4``, ``SPEC sections 2 to 5 and 8``,
``SPEC A5``, ``SPEC 3: A2, A3, A7``, ``(SPEC section 9, amended)``, ``the SPEC``, a bare ``A5``
or ``amended A2`` or ``rule A7`` in prose (comments, docstrings, Markdown text), and
``(section 9)``. A bare ``A5`` is taken for the rule only in prose: code and other strings keep
theirs. Running it again changes nothing. ``--check`` writes nothing and exits 1 when something
would change. It prints each file it changes with its count, then the totals, and names each
Python line it pushed past 100 characters (those want wrapping by hand).
"""

from __future__ import annotations

import argparse
import ast
import io
import os
import posixpath
import re
import sys
import tokenize
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SPEC = "docs/spec.md"
# Files that hold the old forms on purpose (as test data, or as the patterns below).
EXEMPT = {"docs/cite.py", "docs/spec.md", "tests/test_spec.py"}
# Python files whose strings are Markdown written into another page: links are made relative
# to that page.
MARKDOWN_FROM_PYTHON = {"docs/make_upstream.py": "docs/upstream.md"}
MAX_LINE = 100  # ruff's line length for the tree
SKIP_DIRS = {".venv", ".vllm", "build", "mutants", ".git", "__pycache__", "node_modules"}

# --- the new form ---------------------------------------------------------------------------
REF = r"(?:§\d+(?:\.\d+)?|[AR]\d+)\b"
SEP = r"(?:,[ \t]*\n?[ \t]*|\s+and\s+|\s+or\s+|-|/|:[ \t]+)"
CITATION = re.compile(rf"\b[Ss]pec\s+{REF}(?:{SEP}{REF})*")
LINK = re.compile(r"\[[^\]\n]*\]\([^)\s]*\)")

# --- the old forms --------------------------------------------------------------------------
_NUM = r"\d+(?:\.\d+)?\b"
_OLD_SEP = r"(?:\s*,\s*|\s+and\s+|\s+to\s+|\s*-\s*|\s*/\s*|:[ \t]+)"
_SECTIONS = rf"(?:sections?\s+)?{_NUM}(?:{_OLD_SEP}(?:sections?\s+)?{_NUM})*"
_RULES = rf"(?:rules?\s+)?[AR]\d+\b(?:{_OLD_SEP}(?:rules?\s+)?[AR]\d+\b)*"
OLD_RUN = re.compile(
    rf"\bSPEC(\s+)((?:{_SECTIONS})(?:{_OLD_SEP}{_RULES})?|{_RULES})"
    r"(,\s*amended(?=[).,:;]))?"
)
OLD_THE = re.compile(r"\b([Tt]he)\s+SPEC\b(?!\.md)")
OLD_PAREN = re.compile(
    rf"\((\s*)(?:amended\s+)?(sections?\s+{_NUM}"
    rf"(?:{_OLD_SEP}(?:sections?\s+)?{_NUM})*)"
)
BARE = re.compile(
    r"(?<![\w§/.\-])(?:(?:[Aa]mended|rules?)\s+)?A\d+\b"
    r"(?:(?:\s*,\s*|\s+and\s+|\s+to\s+|-|/)A\d+\b)*"
)
_ITEM = re.compile(rf"(sections?\s+)?(rules?\s+)?({_NUM}|[AR]\d+\b)")


def _convert_run(run: str) -> str:
    """An old run of references ("section 3, rules A2 to A6") in the new notation; a bare
    number in a run names a section ("SPEC 6")."""
    out, pos = [], 0
    for m in _ITEM.finditer(run):
        sep = run[pos : m.start()]
        if out:
            out.append(_convert_sep(sep))
        ref = m.group(3)
        out.append(f"§{ref}" if ref[0].isdigit() else ref)
        pos = m.end()
    return "".join(out) + run[pos:]


def _convert_sep(sep: str) -> str:
    """A separator of an old run in the new notation: ranges with "-", a line break kept."""
    word = sep.strip()
    if word in ("to", "-"):
        return "-"
    if word == "/":
        return "/"
    if word == ":":
        return ": "
    if word == ",":
        return "," + (sep[sep.index(",") + 1 :] if "\n" in sep else " ")
    return sep if "\n" in sep else f" {word} "


def _spans(pattern: re.Pattern, text: str) -> list[tuple[int, int]]:
    return [m.span() for m in pattern.finditer(text)]


def _no_spans(text: str) -> list[tuple[int, int]]:
    return []


def _links(text: str) -> list[tuple[int, int]]:
    return _spans(LINK, text)


def _links_and_citations(text: str) -> list[tuple[int, int]]:
    return _spans(LINK, text) + _spans(CITATION, text)


def _starts_sentence(m: re.Match) -> bool:
    before = m.string[: m.start()].rstrip()
    return before.endswith(('"""', "'''", ".")) and not before.endswith("..")


def _spec(m: re.Match) -> str:
    """The word that opens a citation at ``m``: capitalized where a sentence starts."""
    return "Spec" if _starts_sentence(m) else "spec"


def _from_old_run(m: re.Match) -> str:
    return _spec(m) + m.group(1) + _convert_run(m.group(2))


def _from_the(m: re.Match) -> str:
    return f"{m.group(1)} spec"


def _from_paren(m: re.Match) -> str:
    return f"({m.group(1)}spec " + _convert_run(m.group(2))


def _from_bare(m: re.Match) -> str:
    return _spec(m) + " " + _convert_run(re.sub(r"^(?:[Aa]mended|rules?)\s+", "", m.group(0)))


class Rewriter:
    """Rewrites pieces of text; ``count`` adds up the citations it changed."""

    def __init__(self) -> None:
        self.count = 0

    def _sub(self, pattern: re.Pattern, text: str, repl, masked) -> str:
        """``pattern.sub(repl)``, except for matches that start inside ``masked(text)``."""
        spans = masked(text)

        def one(m: re.Match) -> str:
            if any(a <= m.start() < b for a, b in spans):
                return m.group(0)
            new = repl(m)
            self.count += new != m.group(0)
            return new

        return pattern.sub(one, text)

    def plain(self, text: str, prose: bool) -> str:
        """Old forms into the plain new form. ``prose``: a bare rule name is a citation."""
        text = self._sub(OLD_RUN, text, _from_old_run, _links)
        text = self._sub(OLD_THE, text, _from_the, _no_spans)
        if not prose:
            return text
        text = self._sub(OLD_PAREN, text, _from_paren, _links)
        return self._sub(BARE, text, _from_bare, _links_and_citations)

    def linked(self, text: str, target: str) -> str:
        """Plain new-form citations outside links into one link per reference, to ``target``."""

        def link(m: re.Match) -> str:
            out, pos, body = [], 0, m.group(0)
            for i, r in enumerate(re.finditer(REF, body)):
                if i == 0:
                    label = re.sub(r"\s+", " ", body[: r.end()])
                else:
                    out.append(body[pos : r.start()])
                    label = r.group(0)
                out.append(f"[{label}]({target}#{anchor(r.group(0))})")
                pos = r.end()
            return "".join(out) + body[pos:]

        return self._sub(CITATION, text, link, _links)


def anchor(ref: str) -> str:
    """``§4`` -> ``s4``, ``§4.6`` -> ``s4-6``, ``A5`` -> ``a5``, ``R3`` -> ``r3``."""
    if ref.startswith("§"):
        return "s" + ref[1:].replace(".", "-")
    return ref.lower()


# --- file kinds -----------------------------------------------------------------------------
FENCE = re.compile(r"^ {0,3}(`{3,}|~{3,})[^\n]*\n.*?^ {0,3}\1[ \t]*$", re.S | re.M)
CODE_SPAN = re.compile(r"(`+)(?!`).+?(?<!`)\1(?!`)", re.S)


def markdown_segments(text: str) -> list[tuple[bool, str]]:
    """(is_code, piece) pieces of a Markdown text, fenced blocks and code spans as code."""
    pieces, pos = [], 0
    for fence in FENCE.finditer(text):
        pieces += _spans_of(text[pos : fence.start()])
        pieces.append((True, fence.group(0)))
        pos = fence.end()
    return pieces + _spans_of(text[pos:])


def _spans_of(prose: str) -> list[tuple[bool, str]]:
    pieces, pos = [], 0
    for span in CODE_SPAN.finditer(prose):
        pieces.append((False, prose[pos : span.start()]))
        pieces.append((True, span.group(0)))
        pos = span.end()
    pieces.append((False, prose[pos:]))
    return [p for p in pieces if p[1]]


def rewrite_markdown(text: str, target: str, rw: Rewriter) -> str:
    out = []
    for is_code, piece in markdown_segments(text):
        if is_code:
            out.append(rw.plain(piece, prose=False))
        else:  # each citation counts once, when it becomes a link
            out.append(rw.linked(Rewriter().plain(piece, prose=True), target))
    return "".join(out)


def python_prose(source: str) -> list[tuple[int, int, bool]]:
    """The comments and strings of a Python source as (start, end, is_prose) character spans;
    prose is a comment, a string standing as a statement (a docstring) or a triple-quoted one."""
    starts = [0]
    for line in source.splitlines(keepends=True):
        starts.append(starts[-1] + len(line))
    statements = set()
    for node in ast.walk(ast.parse(source)):
        if (
            isinstance(node, ast.Expr)
            and isinstance(node.value, ast.Constant)
            and isinstance(node.value.value, str)
        ):
            statements.add((node.lineno, node.col_offset))
    spans = []
    for tok in tokenize.generate_tokens(io.StringIO(source).readline):
        if tok.type in (tokenize.COMMENT, tokenize.STRING):
            start = starts[tok.start[0] - 1] + tok.start[1]
            end = starts[tok.end[0] - 1] + tok.end[1]
            prose = (
                tok.type == tokenize.COMMENT
                or tok.start in statements
                or tok.string.lstrip("rRbBuUfF")[:3] in ('"""', "'''")
            )
            spans.append((start, end, prose))
    return spans


def rewrite_python(source: str, rw: Rewriter, markdown_target: str | None = None) -> str:
    spans = python_prose(source)
    out, pos = [], 0
    for start, end, prose in spans:
        out.append(source[pos:start])
        piece = source[start:end]
        if markdown_target is not None and not piece.startswith("#"):
            out.append(rewrite_markdown(piece, markdown_target, rw))
        else:
            out.append(rw.plain(piece, prose=prose))
        pos = end
    out.append(source[pos:])
    return "".join(out)


def rewrite_file(rel: str, text: str) -> tuple[str, int]:
    """The new text of the file at ``rel`` (a path from the root) and its count of changes."""
    rw = Rewriter()
    if rel.endswith(".md"):
        new = rewrite_markdown(text, link_target(rel), rw)
    elif rel.endswith(".py"):
        page = MARKDOWN_FROM_PYTHON.get(rel)
        new = rewrite_python(text, rw, link_target(page) if page else None)
    else:
        new = rw.plain(text, prose=True)
    return new, rw.count


def grown_lines(old: str, new: str) -> list[int]:
    """Line numbers of ``new`` that the rewrite made longer than the tree's line limit."""
    before = set(old.splitlines())
    return [
        n
        for n, line in enumerate(new.splitlines(), 1)
        if len(line) > MAX_LINE and line not in before
    ]


def link_target(page: str) -> str:
    """The path from the Markdown page ``page`` to the spec."""
    return posixpath.relpath(SPEC, posixpath.dirname(page) or ".")


def tree_files(root: Path) -> list[str]:
    """Paths (from ``root``) of every file that may cite the spec: Python, Markdown, TOML and
    the CI scripts, outside environments, build output and mutmut's copy of the tree."""
    found = []
    for folder, dirs, names in os.walk(root):
        dirs[:] = sorted(
            d
            for d in dirs
            if d not in SKIP_DIRS
            and not d.endswith(".egg-info")
            and (not d.startswith(".") or d == ".ci")
        )
        rel_dir = Path(folder).relative_to(root)
        for name in sorted(names):
            rel = rel_dir / name
            if rel.suffix in (".py", ".md", ".toml") or rel.parts[:1] == (".ci",):
                found.append(rel.as_posix())
    return sorted(found)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--check", action="store_true", help="write nothing; exit 1 when a citation would change"
    )
    parser.add_argument("--root", type=Path, default=ROOT, help="the tree (default: this one)")
    args = parser.parse_args(argv)
    root = args.root
    if not (root / SPEC).is_file():
        print(f"cite.py: --root {root}: no {SPEC} there", file=sys.stderr)
        return 2
    total = files = 0
    for rel in tree_files(root):
        if rel in EXEMPT:
            continue
        path = root / rel
        try:
            text = path.read_text(encoding="utf-8")
        except UnicodeDecodeError:
            continue
        new, count = rewrite_file(rel, text)
        if new == text:
            continue
        files += 1
        total += count
        print(f"{rel}: {count}")
        for line in grown_lines(text, new) if rel.endswith(".py") else ():
            print(f"  {rel}:{line}: now longer than {MAX_LINE} characters; wrap it by hand")
        if not args.check:
            path.write_text(new, encoding="utf-8")
    verb = "would change" if args.check else "changed"
    print(f"{total} citations {verb} in {files} files")
    return 1 if args.check and files else 0


if __name__ == "__main__":
    sys.exit(main())
