"""Every in-repository document reference resolves (CPU).

Scanned: text files under aiter_mla/, templates/, op_tests/, scripts/, plus README.md and the
markdown files under docs/. Checked:

(a) no code file cites a document outside the repository (the design notes that used to live
    beside it: the old design guide's and spec's section numbers, the workplace's shared/
    folder, ...); the pattern is spelled in pieces below so that this file does not match it;
(b) every ``docs/DESIGN.md §N`` / ``§N.M`` names a heading of docs/DESIGN.md (``## N.`` or
    ``### N.M``); inside docs/ the form ``DESIGN.md §N`` is accepted too; a bare ``§N`` outside
    docs/DESIGN.md is ambiguous and refused;
(c) every path-like reference to a repository file (``docs/...``, ``aiter_mla/...``,
    ``templates/...``, ``op_tests/...``, ``scripts/...``, ``.ci/...``) exists; globs and
    placeholders are skipped, ``{a,b}`` is expanded;
(d) every "issue N change K" has a ``## Issue N`` section in docs/perf/notes.md with a row whose
    first cell is ``change K``; a bare "change K" next to a mention of notes.md means issue 6,
    and inside notes.md the issue of the section it sits in.

Run as a script (``python3 op_tests/test_doc_references.py``) to print every unresolved
reference, grouped by kind.
"""
from __future__ import annotations

import re
import sys
from functools import lru_cache
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
CODE_DIRS = ("aiter_mla", "templates", "op_tests", "scripts")
TOP_FILES = ("README.md",)
SELF = Path(__file__).resolve()
SKIP_SUFFIXES = {".png", ".jpg", ".so", ".pyc", ".o", ".hsaco", ".cubin", ".json"}
DESIGN = ROOT / "docs" / "DESIGN.md"
NOTES = ROOT / "docs" / "perf" / "notes.md"

#: (a) citations of documents outside the repository (the brief's grep, plus the shared folder).
_EXTERNAL_WORDS = ("DESIGN ?" + "§", "spec ?" + "§", "spec [0-9]", "spec" + " section",
                   "sm90_kernel" + "_notes", "jit_cache" + "_practices", "aiter_hk_mla" + "_spec",
                   "nvidia_mla" + "_peers", r"\.\./" + "shared", r"\.\./" + "peers",
                   r"(?<![\w.-])" + "shared/" + "(?:docs|seed|bench|peers)/")
EXTERNAL = re.compile("|".join(_EXTERNAL_WORDS))

_SEC = r"§\s?\d+(?:\.\d+)*"
_SEP = r"(?:\s*(?:,|;|/|-|–|and|or|&)\s*)"
#: (b) a DESIGN.md citation: the file name, then one or more section numbers.
DESIGN_CITE = re.compile(rf"(?P<prefix>(?<![\w/.-])docs/|(?<![\w/.-]))DESIGN\.md(?P<secs>\s*{_SEC}(?:{_SEP}{_SEC})*)")
SECTION_NUM = re.compile(r"§\s?(\d+(?:\.\d+)*)")

#: (c) a repository-relative path (folders) or a top-level file.
PATH_REF = re.compile(
    r"(?<![\w./\-~$%@])((?:docs|aiter_mla|templates|op_tests|scripts|\.ci)/[\w./\-*{},<>]*)")

#: (d) "issue 6 change 18", "Issue 6, change 17", "issue-6 changes 3-5", "issue 6, changes 18, 19"
# (a citation may wrap onto the next comment line: "issue 6\n//   change 18")
_GAP1 = r"(?:\s|//+|#:?|\*)"   # whitespace, or a comment marker where a citation wraps
_GAP = _GAP1 + "+"
_NUMS = rf"\d+(?:{_GAP1}*(?:-|–|,|and|&)\s*\d+)*"
ISSUE_CHANGE = re.compile(rf"\bissue[ -]?(\d+){_GAP1}*[,;:]?{_GAP}changes?{_GAP}({_NUMS})", re.IGNORECASE)
CHANGE = re.compile(rf"\bchanges?{_GAP}({_NUMS})", re.IGNORECASE)


def _rel(path: Path) -> str:
    return path.relative_to(ROOT).as_posix()


@lru_cache(maxsize=None)
def scanned_files() -> tuple[Path, ...]:
    files: list[Path] = []
    for d in CODE_DIRS:
        for p in sorted((ROOT / d).rglob("*")):
            if not p.is_file() or p.resolve() == SELF or p.suffix in SKIP_SUFFIXES:
                continue
            if "__pycache__" in p.parts or any(part.endswith(".egg-info") for part in p.parts):
                continue
            files.append(p)
    files += [ROOT / f for f in TOP_FILES if (ROOT / f).is_file()]
    files += sorted((ROOT / "docs").rglob("*.md"))
    return tuple(files)


@lru_cache(maxsize=None)
def lines_of(path: Path) -> tuple[str, ...]:
    try:
        return tuple(path.read_text(encoding="utf-8").splitlines())
    except (UnicodeDecodeError, OSError):
        return ()


def _is_code(path: Path) -> bool:
    return _rel(path).split("/", 1)[0] in CODE_DIRS


def _in_docs(path: Path) -> bool:
    return _rel(path).startswith("docs/")


@lru_cache(maxsize=None)
def design_sections() -> frozenset[str]:
    secs = set()
    for line in lines_of(DESIGN):
        m = re.match(r"^## (\d+)\. \S", line) or re.match(r"^### (\d+\.\d+) \S", line)
        if m:
            secs.add(m.group(1))
    return frozenset(secs)


@lru_cache(maxsize=None)
def notes_changes() -> dict[int, frozenset[int]]:
    """Issue number -> change numbers that have a ``| change K |`` row in its section."""
    out: dict[int, set[int]] = {}
    issue = None
    for line in lines_of(NOTES):
        m = re.match(r"^## Issue (\d+): \S", line)
        if m:
            issue = int(m.group(1))
            out.setdefault(issue, set())
            continue
        if line.startswith("## "):
            issue = None
            continue
        m = re.match(r"^\|\s*change (\d+)\s*\|", line)
        if m and issue is not None:
            out[issue].add(int(m.group(1)))
    return {k: frozenset(v) for k, v in out.items()}


def _numbers(text: str) -> list[int]:
    """'3-5' -> [3, 4, 5]; '18, 19' / '18 and 19' -> [18, 19]."""
    nums: list[int] = []
    text = re.sub(r"//+|#:?|\*", " ", text)
    for part in re.split(r"\s*(?:,|and|&)\s*", text):
        m = re.fullmatch(r"(\d+)\s*[-–]\s*(\d+)", part.strip())
        if m:
            lo, hi = int(m.group(1)), int(m.group(2))
            nums += list(range(lo, hi + 1)) if 0 <= hi - lo <= 50 else [lo, hi]
        elif part.strip().isdigit():
            nums.append(int(part.strip()))
    return nums


def _expand_braces(ref: str) -> list[str] | None:
    """``a/{b,c}.py`` -> [a/b.py, a/c.py]; a ``{name}`` placeholder (no comma) -> None."""
    m = re.search(r"\{([^{}]*)\}", ref)
    if not m:
        return [ref]
    if "," not in m.group(1):
        return None
    out: list[str] = []
    for alt in m.group(1).split(","):
        sub = _expand_braces(ref[:m.start()] + alt.strip() + ref[m.end():])
        if sub is None:
            return None
        out += sub
    return out


# ---------------------------------------------------------------------------------------------
# the four kinds of problems, as (file:line, reference) pairs

def external_citations() -> list[tuple[str, str]]:
    found = []
    for p in scanned_files():
        if not _is_code(p):
            continue
        for i, line in enumerate(lines_of(p), 1):
            if EXTERNAL.search(line):
                found.append((f"{_rel(p)}:{i}", line.strip()))
    return found


def design_problems() -> list[tuple[str, str]]:
    secs = design_sections()
    found = []
    for p in scanned_files():
        own = p == DESIGN
        for i, line in enumerate(lines_of(p), 1):
            # a code line citing an outside document is reported once, by (a)
            external = _is_code(p) and EXTERNAL.search(line) is not None
            covered: list[tuple[int, int]] = []
            for m in DESIGN_CITE.finditer(line):
                covered.append(m.span())
                if not m.group("prefix") and not _in_docs(p):
                    found.append((f"{_rel(p)}:{i}", f"{m.group(0).strip()} (cite it as docs/DESIGN.md §N)"))
                for n in SECTION_NUM.findall(m.group("secs")):
                    if n not in secs:
                        found.append((f"{_rel(p)}:{i}", f"DESIGN.md §{n} (no such heading)"))
            for m in SECTION_NUM.finditer(line):
                if external or any(a <= m.start() < b for a, b in covered):
                    continue
                n = m.group(1)
                if own:
                    if n not in secs:
                        found.append((f"{_rel(p)}:{i}", f"§{n} (no such heading in docs/DESIGN.md)"))
                else:
                    found.append((f"{_rel(p)}:{i}", f"§{n} (bare section sign: which document?)"))
    return found


#: Paths that exist only in a built wheel (setup.py makes them), not in the checkout.
BUILT_PATHS = ("aiter_mla/_data/",)


def path_problems() -> list[tuple[str, str]]:
    found = []
    for p in scanned_files():
        for i, line in enumerate(lines_of(p), 1):
            for m in PATH_REF.finditer(line):
                ref = m.group(1).rstrip(".,;:)")
                if any(c in ref for c in "*<>") or ref.endswith(("{", ",")) or "..." in ref:
                    continue
                refs = _expand_braces(ref)
                if refs is None:
                    continue
                for r in refs:
                    r = r.rstrip(".,;:)")
                    if r and not r.startswith(BUILT_PATHS) and not (ROOT / r).exists():
                        found.append((f"{_rel(p)}:{i}", r))
    return found


def change_problems() -> list[tuple[str, str]]:
    known = notes_changes()
    found = []

    def check(where: str, issue: int, k: int, text: str) -> None:
        text = " ".join(text.split())
        if issue not in known:
            found.append((where, f"{text} (no '## Issue {issue}:' section in docs/perf/notes.md)"))
        elif k not in known[issue]:
            found.append((where, f"{text} (no '| change {k} |' row under Issue {issue})"))

    for p in scanned_files():
        lines = lines_of(p)
        text = "\n".join(lines)
        starts = [0]
        for line in lines:
            starts.append(starts[-1] + len(line) + 1)

        def line_no(offset: int) -> int:   # 1-based
            lo, hi = 0, len(lines) - 1
            while lo < hi:
                mid = (lo + hi + 1) // 2
                if starts[mid] <= offset:
                    lo = mid
                else:
                    hi = mid - 1
            return lo + 1

        section_issue: dict[int, int | None] = {}
        if p == NOTES:
            current = None
            for i, line in enumerate(lines, 1):
                m = re.match(r"^## Issue (\d+): ", line)
                if m:
                    current = int(m.group(1))
                elif line.startswith("## "):
                    current = None
                section_issue[i] = current
        covered = []
        for m in ISSUE_CHANGE.finditer(text):
            covered.append(m.span())
            for k in _numbers(m.group(2)):
                check(f"{_rel(p)}:{line_no(m.start())}", int(m.group(1)), k, m.group(0))
        for m in CHANGE.finditer(text):
            if any(a <= m.start() < b for a, b in covered):
                continue
            i = line_no(m.start())
            if p == NOTES:
                issue = section_issue.get(i)
            else:
                near = any("notes.md" in lines[j] for j in range(max(0, i - 2), min(len(lines), i + 1)))
                issue = 6 if near else None
            if issue is None:
                continue
            for k in _numbers(m.group(1)):
                check(f"{_rel(p)}:{i}", issue, k, m.group(0))
    return found


KINDS = {
    "external citation (a)": external_citations,
    "DESIGN.md section (b)": design_problems,
    "missing path (c)": path_problems,
    "issue/change (d)": change_problems,
}


def _report(found: list[tuple[str, str]]) -> str:
    return "\n".join(f"{where}: {ref}" for where, ref in found)


# ---------------------------------------------------------------------------------------------

def test_design_doc_has_numbered_sections():
    assert DESIGN.is_file(), "docs/DESIGN.md is missing"
    tops = [int(m.group(1)) for line in lines_of(DESIGN) if (m := re.match(r"^## (\d+)\. \S", line))]
    assert tops == list(range(1, len(tops) + 1)) and tops, f"top-level headings must be ## 1. .. ## N.: {tops}"
    for line in lines_of(DESIGN):
        m = re.match(r"^### (\d+)\.(\d+) \S", line)
        if m:
            assert int(m.group(1)) in tops, f"subsection {m.group(0)} has no parent section"


def test_notes_has_issue_sections_with_change_rows():
    assert NOTES.is_file(), "docs/perf/notes.md is missing"
    assert len(lines_of(NOTES)) <= 300, f"docs/perf/notes.md has {len(lines_of(NOTES))} lines (at most 300)"
    assert notes_changes(), "docs/perf/notes.md has no '## Issue N: title' section with '| change K |' rows"


def test_no_external_document_citations_in_code():
    found = external_citations()
    assert not found, "code cites documents outside the repository:\n" + _report(found)


def test_design_section_citations_resolve():
    found = design_problems()
    assert not found, "unresolved docs/DESIGN.md section citations:\n" + _report(found)


def test_repository_paths_exist():
    found = path_problems()
    assert not found, "references to repository paths that do not exist:\n" + _report(found)


def test_issue_change_citations_resolve():
    found = change_problems()
    assert not found, "issue/change citations without a row in docs/perf/notes.md:\n" + _report(found)


def test_helpers():
    assert _numbers("3-5") == [3, 4, 5] and _numbers("18, 19") == [18, 19] and _numbers("18 and 19") == [18, 19]
    assert _expand_braces("aiter_mla/ops/{metadata,decode}.py") == ["aiter_mla/ops/metadata.py",
                                                                    "aiter_mla/ops/decode.py"]
    assert _expand_braces("templates/{name}.j2") is None
    assert [m.group(1) for m in ISSUE_CHANGE.finditer("(issue 6, change 17) and Issue 6 change 18")] == ["6", "6"]
    assert ISSUE_CHANGE.search("until issue 6\n  // change 18;").group(2) == "18"
    assert EXTERNAL.search("see ../" + "shared/docs/x") and not EXTERNAL.search("docs/DESIGN.md §3")
    assert DESIGN_CITE.search("docs/DESIGN.md §3.1, §5").group("secs").count("§") == 2


def test_perf_records_hold_no_local_checkout_paths():
    """Two docs/perf records named their arms by the author's checkout ("/work/main/.ab/b3/
    templates"): a path that exists on no reader's machine. Records name arms relative to the
    repository (an audit found them)."""
    bad = sorted(p.name for p in (ROOT / "docs" / "perf").glob("*.json")
                 if re.search(r"/work/main/|" + re.escape(str(ROOT)) + "/", p.read_text(encoding="utf-8")))
    assert not bad, f"docs/perf records with absolute checkout paths: {bad}"


if __name__ == "__main__":
    total = 0
    for kind, fn in KINDS.items():
        found = fn()
        total += len(found)
        print(f"== {kind}: {len(found)}")
        if found:
            print(_report(found))
        print()
    sys.exit(1 if total else 0)

