"""Every citation of the spec resolves: docs/spec.md has an anchor for every section and rule,
and each ``spec §4`` / ``spec A5`` / ``spec R3`` in code and each link to the spec in Markdown
names one of them (docs/spec.md, "Citing it").

The checker here is written apart from docs/cite.py (the rewriter), so that one does not hide
the other's mistakes; known-bad cases show each check failing, and cite.py's output on the old
forms must pass the checker. Imports nothing from kvgate.
"""

from __future__ import annotations

import ast
import io
import posixpath
import re
import tokenize
from pathlib import Path

import pytest

from bench.report_page import cite_module as load_cite

ROOT = Path(__file__).resolve().parents[1]
SPEC = "docs/spec.md"
# Files that hold old or broken citations on purpose: this test's bad cases and the
# rewriter's patterns. (The spec itself is checked, but may use its own names bare.)
EXEMPT = {"tests/test_spec.py", "docs/cite.py"}

REF = r"(?:§\d+(?:\.\d+)?|[AR]\d+)\b"
SEP = r"(?:,[ \t]*\n?[ \t]*|\s+and\s+|\s+or\s+|-|/|:[ \t]+)"
CITATION = re.compile(rf"\b[Ss]pec\s+({REF}(?:{SEP}{REF})*)")
ONE_REF = re.compile(REF)
LINK = re.compile(r"\[([^\]\n]*)\]\(([^)\s#]*)(?:#([^)\s]*))?\)")
STALE = [
    (re.compile(r"\bSPEC(?:'s)?\s+(?:sections?\b|§|[AR]\d|\d)"), "SPEC followed by a reference"),
    (re.compile(r"\bSPEC's\b"), "SPEC's"),
    (re.compile(r"\b(?:[Tt]he|[Oo]ur)\s+SPEC\b"), "'the SPEC'"),
    (re.compile(r"\bSPEC\.md\b"), "SPEC.md (outside this repository)"),
    (re.compile(r"\(\s*(?:amended\s+)?sections?\s+\d"), "'(section N)' with no 'spec'"),
]
BARE = re.compile(r"(?<![\w§/.\-])(?:A\d+\b|§\d)")
FENCE = re.compile(r"^ {0,3}(`{3,}|~{3,})[^\n]*\n.*?^ {0,3}\1[ \t]*$", re.S | re.M)
CODE_SPAN = re.compile(r"(`+)(?!`).+?(?<!`)\1(?!`)", re.S)


def anchor_of(ref: str) -> str:
    return "s" + ref[1:].replace(".", "-") if ref.startswith("§") else ref.lower()


def spec_anchors(text: str) -> list[str]:
    return re.findall(r'<a id="([^"]+)"></a>', text)


ANCHORS = set(spec_anchors((ROOT / SPEC).read_text(encoding="utf-8")))


# --- the checker ----------------------------------------------------------------------------


class Checker:
    """Findings for one file: ``check(text, regions)``, each region (start, end, kind) with
    kind "prose" (bare rule names are citations), "string" (any other string: only explicit
    citations), "markdown" (links required) or "code" (Markdown code: plain form allowed)."""

    def __init__(self, rel: str, anchors: set[str], page: str | None = None):
        self.rel, self.anchors = rel, anchors
        self.page = page or rel  # links resolve from this page
        self.found: list[str] = []
        self.text = ""

    def say(self, pos: int, what: str) -> None:
        line = self.text.count("\n", 0, pos) + 1
        self.found.append(f"{self.rel}:{line}: {what}")

    def check(self, text: str, regions: list[tuple[int, int, str]]) -> list[str]:
        self.text = text
        for start, end, kind in regions:
            self.region(start, text[start:end], kind)
        return self.found

    def region(self, base: int, piece: str, kind: str) -> None:
        stale = []
        for pattern, what in STALE:
            for m in pattern.finditer(piece):
                stale.append((m.start(), m.end() + 8))  # the reference after it is said
                self.say(base + m.start(), f"old citation form ({what}): {m.group(0)!r}")
        if kind == "code":
            links = []  # Markdown code shows links as text; only the plain form counts there
        else:
            links = [m.span() for m in LINK.finditer(piece)]
            for m in LINK.finditer(piece):
                self.link(base + m.start(), m)
        cited = []
        for m in CITATION.finditer(piece):
            if any(a <= m.start() < b for a, b in links):
                continue
            cited.append(m.span())
            self.refs(base + m.start(), m.group(1))
            if kind == "markdown":
                self.say(
                    base + m.start(),
                    f"{m.group(0)!r} in Markdown text: write it as a link to its anchor",
                )
        if kind in ("prose", "markdown"):
            masked = links + cited + stale
            for m in BARE.finditer(piece):
                if not any(a <= m.start() < b for a, b in masked):
                    self.say(
                        base + m.start(),
                        f"bare rule or section name {m.group(0)!r}: cite it as 'spec ...'",
                    )

    def refs(self, pos: int, body: str) -> None:
        refs = list(ONE_REF.finditer(body))
        for r in refs:
            if anchor_of(r.group(0)) not in self.anchors:
                self.say(pos, f"spec {r.group(0)} names no anchor in {SPEC}")
        for left, right in zip(refs, refs[1:]):
            if body[left.end() : right.start()] == "-":
                a, b = left.group(0), right.group(0)
                if a[0] != b[0] or _number(a) >= _number(b):
                    self.say(pos, f"range {a}-{b} is not an increasing range of one kind")

    def link(self, pos: int, m: re.Match) -> None:
        text, path, fragment = m.group(1), m.group(2), m.group(3)
        if path == "":
            target = self.page
        else:
            target = posixpath.normpath(posixpath.join(posixpath.dirname(self.page), path))
        if target != SPEC:
            if path.endswith("spec.md"):
                self.say(pos, f"link {path!r} from {self.page} does not reach {SPEC}")
            return
        if fragment is None:
            return
        if fragment not in self.anchors:
            self.say(pos, f"link to #{fragment}: no such anchor in {SPEC}")
            return
        named = ONE_REF.findall(text)
        if named and (
            len(named) > 1
            or anchor_of(named[0]) != fragment
            or not re.fullmatch(rf"(?:[Ss]pec\s+)?{REF}", text)
        ):
            self.say(pos, f"link text {text!r} does not name its anchor #{fragment}")


def _number(ref: str) -> tuple[int, ...]:
    return tuple(int(n) for n in re.findall(r"\d+", ref))


def markdown_regions(text: str) -> list[tuple[int, int, str]]:
    regions, pos = [], 0
    fences = [m.span() for m in FENCE.finditer(text)] + [(len(text), len(text))]
    for start, end in fences:
        for m in CODE_SPAN.finditer(text, pos, start):
            regions += [(pos, m.start(), "markdown"), (m.start(), m.end(), "code")]
            pos = m.end()
        regions += [(pos, start, "markdown"), (start, end, "code")]
        pos = end
    return [r for r in regions if r[0] < r[1]]


def python_regions(source: str) -> list[tuple[int, int, str]]:
    """Comments, docstrings and triple-quoted strings are prose; other strings are strings;
    code is not looked at (``A1 = {...}`` names a variable, not a rule)."""
    starts = [0]
    for line in source.splitlines(keepends=True):
        starts.append(starts[-1] + len(line))
    statements = {
        (n.lineno, n.col_offset)
        for n in ast.walk(ast.parse(source))
        if isinstance(n, ast.Expr)
        and isinstance(n.value, ast.Constant)
        and isinstance(n.value.value, str)
    }
    regions = []
    for tok in tokenize.generate_tokens(io.StringIO(source).readline):
        if tok.type in (tokenize.COMMENT, tokenize.STRING):
            start = starts[tok.start[0] - 1] + tok.start[1]
            end = starts[tok.end[0] - 1] + tok.end[1]
            prose = (
                tok.type == tokenize.COMMENT
                or tok.start in statements
                or tok.string.lstrip("rRbBuUfF")[:3] in ('"""', "'''")
            )
            regions.append((start, end, "prose" if prose else "string"))
    return regions


def check_text(
    rel: str, text: str, anchors: set[str] = ANCHORS, page: str | None = None
) -> list[str]:
    """The findings for the file ``rel`` holding ``text``."""
    checker = Checker(rel, anchors, page)
    if rel == SPEC:
        # The spec uses its own names bare and links within itself; check the links and
        # the citation examples.
        return checker.check(
            text, [(s, e, "string" if k == "markdown" else k) for s, e, k in markdown_regions(text)]
        )
    if rel.endswith(".md"):
        return checker.check(text, markdown_regions(text))
    if rel.endswith(".py"):
        return checker.check(text, python_regions(text))
    return checker.check(text, [(0, len(text), "prose")])


# --- the spec's anchors ---------------------------------------------------------------------


def anchor_problems(text: str) -> list[str]:
    """What is missing or doubled among the spec's anchors: sections 1-10, rules A1-A8 and
    R1-R7, each anchor right before its heading or its rule's bold label."""
    ids = spec_anchors(text)
    problems = [f"anchor {i} twice" for i in sorted(set(ids)) if ids.count(i) > 1]
    wanted = [(f"s{n}", rf"\n## {n}\. ") for n in range(1, 11)]
    wanted += [(f"a{n}", rf"\*\*A{n}\. ") for n in range(1, 9)]
    wanted += [(f"r{n}", rf"\*\*R{n}\. ") for n in range(1, 8)]
    for sub in (i for i in ids if re.fullmatch(r"s\d+-\d+", i)):
        major, minor = sub[1:].split("-")
        wanted.append((sub, rf"\n### {major}\.{minor} "))
    for name, after in wanted:
        if not re.search(rf'<a id="{name}"></a>{after}', text):
            problems.append(f"no anchor {name} before its heading or rule")
    odd = [i for i in ids if i != "cite" and not re.fullmatch(r"s\d+(-\d+)?|[ar]\d", i)]
    return problems + [f"anchor {i} is not a section or rule name" for i in odd]


def test_the_spec_has_an_anchor_for_every_section_and_rule():
    assert anchor_problems((ROOT / SPEC).read_text(encoding="utf-8")) == []


@pytest.mark.parametrize(
    "old, new, why",
    [
        ('<a id="r3"></a>', "", "no anchor r3"),
        ('<a id="s7"></a>\n', "", "no anchor s7"),
        ('<a id="a5"></a>', '<a id="a4"></a>', "anchor a4 twice"),
        ('<a id="s4-6"></a>', '<a id="s4-6"></a><a id="tmp"></a>', "not a section or rule"),
    ],
)
def test_the_anchor_check_refuses_a_spec_that_lost_one(old, new, why):
    text = (ROOT / SPEC).read_text(encoding="utf-8")
    assert old in text
    problems = anchor_problems(text.replace(old, new, 1))
    assert any(why in p for p in problems), problems


# --- the checker catches what it must (known-bad cases) -------------------------------------

BAD = [
    ("impl/x.py", '"""Eviction, spec A9."""\n', "names no anchor"),
    ("impl/x.py", "# the copy path (spec §19)\n", "names no anchor"),
    ("impl/x.py", "# spec §4.9 has it\n", "names no anchor"),
    ("impl/x.py", '"""See SPEC section 4."""\n', "old citation form"),
    ("impl/x.py", 'X = "counts once (SPEC A5)"\n', "old citation form"),
    ("impl/x.py", '"""Choices where the SPEC is silent."""\n', "old citation form"),
    ("impl/x.py", '"""As /work/shared/SPEC.md says."""\n', "old citation form"),
    ("impl/x.py", '"""Made per offer (section 9)."""\n', "old citation form"),
    ("impl/x.py", "x = 1  # A5: skipped once\n", "bare rule"),
    ("impl/x.py", '"""spec A8-A2 hold."""\n', "not an increasing range"),
    ("README.md", "counted once (spec A5).\n", "write it as a link"),
    ("README.md", "counted once ([spec A5](docs/spec.md#a2)).\n", "does not name its anchor"),
    ("README.md", "counted once ([spec A5](docs/spec.md#a9)).\n", "no such anchor"),
    ("docs/x.md", "counted once ([spec A5](docs/spec.md#a5)).\n", "does not reach"),
    ("docs/replay/x.md", "see [spec §4](spec.md#s4).\n", "does not reach"),
    ("docs/x.md", "one per claim A1-A8.\n", "bare rule"),
    ("docs/x.md", "```\nSPEC section 7\n```\n", "old citation form"),
]
GOOD = [
    ("impl/x.py", '"""spec §4.6, A5 and R3; spec §2-§5 and §8; spec A2/A7; spec §3: A2, A3."""\n'),
    ("impl/x.py", 'A1 = {"offers": []}\nassert got == A1\n'),
    ("impl/x.py", 'p.add_argument("--target", metavar="SPEC")  # a target SPEC\n'),
    ("impl/x.py", '"""Spans lines (spec\n§9), and lists:\n spec A2,\n A5."""\n'),
    ("tests/x.py", 'make("R1", tokens)  # R1 and R2 are request names here\n'),
    (
        "README.md",
        "once ([spec A5](docs/spec.md#a5)); [spec §2](docs/spec.md#s2)-"
        "[§5](docs/spec.md#s5); [the rule](docs/spec.md#s3); `spec A5`, `A5`.\n",
    ),
    ("docs/replay/x.md", "see [spec R3](../spec.md#r3).\n```\nspec A7 in a log\n```\n"),
]


@pytest.mark.parametrize("rel, text, why", BAD, ids=[f"bad{i}" for i in range(len(BAD))])
def test_the_checker_refuses_a_broken_citation(rel, text, why):
    found = check_text(rel, text)
    assert any(why in f for f in found), found


@pytest.mark.parametrize("rel, text", GOOD, ids=[f"good{i}" for i in range(len(GOOD))])
def test_the_checker_accepts_the_form(rel, text):
    assert check_text(rel, text) == []


def test_a_dangling_citation_in_a_tree_fails_the_tree_check(tmp_path):
    """The whole-tree check on a small tree with one dangling citation names that file."""
    (tmp_path / "docs").mkdir()
    (tmp_path / SPEC).write_text((ROOT / SPEC).read_text(encoding="utf-8"), encoding="utf-8")
    (tmp_path / "good.py").write_text('"""Admission, spec A5."""\n', encoding="utf-8")
    (tmp_path / "bad.py").write_text('"""Admission, spec A12."""\n', encoding="utf-8")
    found = tree_findings(tmp_path)
    assert len(found) == 1 and found[0].startswith("bad.py:1:"), found


# --- cite.py --------------------------------------------------------------------------------

REWRITES = [
    (
        "impl/x.py",
        '"""The manager: SPEC sections 2 to 5 and 8."""\n',
        '"""The manager: spec §2-§5 and §8."""\n',
    ),
    (
        "impl/x.py",
        '"""(SPEC section 3, A1-A6) as one; SPEC 3: A2, A3, A7."""\n',
        '"""(spec §3, A1-A6) as one; spec §3: A2, A3, A7."""\n',
    ),
    (
        "impl/x.py",
        '"""(SPEC A5, amended: once) and (SPEC A2 and A5,\namended), too."""\n',
        '"""(spec A5: once) and (spec A2 and A5), too."""\n',
    ),
    (
        "impl/x.py",
        '"""Where the SPEC is silent; (section 9); (amended section 5)."""\n',
        '"""Where the spec is silent; (spec §9); (spec §5)."""\n',
    ),
    (
        "impl/x.py",
        '"""before (amended A2); rules A2 to A6; rule A7."""\n',
        '"""before (spec A2); spec A2-A6; spec A7."""\n',
    ),
    (
        "impl/x.py",
        'A1 = {}  # A1\nmsg = "A1 (SPEC section 6)"\n',
        'A1 = {}  # spec A1\nmsg = "A1 (spec §6)"\n',
    ),
    ("impl/x.py", '"""adopted (SPEC\nsection 9), all."""\n', '"""adopted (spec\n§9), all."""\n'),
    (
        "README.md",
        "packages SPEC section 10 lists, `SPEC A5` and (SPEC A2 and A5,\namended).\n",
        "packages [spec §10](docs/spec.md#s10) lists, `spec A5` and "
        "([spec A2](docs/spec.md#a2) and [A5](docs/spec.md#a5)).\n",
    ),
    (
        "docs/replay/README.md",
        "as SPEC A7 starts it; rule A7.\n```\nSPEC A7\n```\n",
        "as [spec A7](../spec.md#a7) starts it; [spec A7](../spec.md#a7).\n```\nspec A7\n```\n",
    ),
    (
        "docs/make_upstream.py",
        'X = "and SPEC A2 now follows it"\n',
        'X = "and [spec A2](spec.md#a2) now follows it"\n',
    ),
]


@pytest.mark.parametrize(
    "rel, old, new", REWRITES, ids=[r[0] + str(i) for i, r in enumerate(REWRITES)]
)
def test_cite_rewrites_the_old_forms_into_the_one_form(rel, old, new):
    cite = load_cite()
    out, count = cite.rewrite_file(rel, old)
    assert out == new
    assert count >= 1
    assert cite.rewrite_file(rel, out) == (out, 0)  # idempotent
    page = cite.MARKDOWN_FROM_PYTHON.get(rel)
    assert check_text(rel, out, page=page) == [], out
    assert check_text(rel, old, page=page) != []  # the old text was refused


def test_cite_leaves_the_new_form_and_code_alone():
    cite = load_cite()
    for rel, text in GOOD:
        assert cite.rewrite_file(rel, text) == (text, 0), rel


# --- the tree -------------------------------------------------------------------------------


def tree_findings(root: Path) -> list[str]:
    cite = load_cite()
    anchors = set(spec_anchors((root / SPEC).read_text(encoding="utf-8")))
    found = []
    for rel in cite.tree_files(root):  # the one walker (the checker stays apart)
        if rel in EXEMPT:
            continue
        try:
            text = (root / rel).read_text(encoding="utf-8")
        except UnicodeDecodeError:
            continue
        found += check_text(rel, text, anchors, page=cite.MARKDOWN_FROM_PYTHON.get(rel))
    return found


def test_every_citation_in_the_tree_resolves():
    """Code, docs, TOML and the CI scripts (outside .venv, .vllm, build, mutants). After the
    old forms are rewritten (``python docs/cite.py``), nothing is left to find."""
    found = tree_findings(ROOT)
    assert not found, (
        f"{len(found)} citations to fix (python docs/cite.py rewrites the old "
        "forms):\n" + "\n".join(found[:60])
    )
