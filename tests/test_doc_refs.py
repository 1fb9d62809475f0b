"""Every `SPEC §N` in the code names a section of docs/recipe.md, and the results files link to
each other (a reference into a file that is not in the repository is how the recipe's section
numbers went unresolved before docs/ existed)."""

import pathlib
import re

ROOT = pathlib.Path(__file__).resolve().parents[1]
SPEC_REF = re.compile(r"SPEC §(\d+)(?:[–-](\d+))?")


def _recipe_sections():
    text = (ROOT / "docs" / "recipe.md").read_text()
    return {int(n) for n in re.findall(r"^## §(\d+)\.", text, flags=re.M)}


def _spec_refs():
    refs = []
    for folder in ("avalon", "configs", "experiments", "tests", "docs", "launch"):
        for path in sorted((ROOT / folder).rglob("*")):
            if path.suffix not in (".py", ".md", ".cc", ".sh") or not path.is_file():
                continue
            for line_no, line in enumerate(path.read_text(errors="replace").splitlines(), 1):
                for m in SPEC_REF.finditer(line):
                    first = int(m.group(1))
                    last = int(m.group(2) or first)
                    for n in range(first, last + 1):
                        refs.append((f"{path.relative_to(ROOT)}:{line_no}", n))
    return refs


def test_every_spec_reference_names_a_section_of_the_recipe():
    sections = _recipe_sections()
    assert sections == {1, 2, 3, 4, 5}, sections
    refs = _spec_refs()
    assert len(refs) > 40  # the code cites the recipe throughout; none found means a broken scan
    unresolved = [(where, n) for where, n in refs if n not in sections]
    assert not unresolved, f"SPEC § references with no section in docs/recipe.md: {unresolved}"


def test_the_results_files_link_to_each_other():
    results = ROOT / "experiments" / "bench" / "RESULTS.md"
    history = ROOT / "docs" / "results_history.md"
    for source, target in ((results, history), (history, results)):
        links = re.findall(r"\]\(([^)#]+)\)", source.read_text())
        resolved = {(source.parent / link).resolve() for link in links}
        assert target.resolve() in resolved, f"{source.name} does not link to {target.name}"
