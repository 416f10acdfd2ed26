"""Rule documentation generated from the registry: the rule table (`qaudit rules --format
markdown`, README.md between the markers below) and one page per rule (docs/rules/QA###.md).

The registry and the rules' docstrings are the only source; `scripts/rules-doc` writes the files
and tests/test_rules_doc.py fails when they drift. Same registry, same bytes: no dates, no paths
outside the repository.
"""

from __future__ import annotations

import inspect
from typing import Mapping

from qaudit.judge.rules import Rule

BEGIN, END = "<!-- rules:begin -->", "<!-- rules:end -->"
DOCS_DIR = "docs/rules"


def _cell(text: str) -> str:
    # A `|` in a title would end the table cell.
    return text.replace("|", "\\|")


def rules_table(rules: Mapping[str, Rule]) -> str:
    """The Markdown rule table, one row per rule in ID order, each ID linked to its page."""
    lines = ["| rule | severity | title |", "|---|---|---|"]
    for rule in sorted(rules.values(), key=lambda r: r.id):
        lines.append(f"| [{rule.id}]({DOCS_DIR}/{rule.id}.md) | {rule.severity} | "
                     f"{_cell(rule.title)} |")
    return "\n".join(lines) + "\n"


def source_file(rule: Rule) -> str:
    return rule.check.__module__.replace(".", "/") + ".py"


def rule_page(rule: Rule) -> str:
    """docs/rules/<ID>.md: title, severity, where the rule lives, then its docstring."""
    return (f"# {rule.id}: {rule.title}\n\n"
            f"Severity: **{rule.severity}**. Rule code: `{source_file(rule)}`.\n\n"
            f"{inspect.cleandoc(rule.doc)}\n\n"
            f"<!-- Generated from the rule's docstring by scripts/rules-doc; edit the docstring, "
            f"not this file. -->\n")


def rule_pages(rules: Mapping[str, Rule]) -> dict[str, str]:
    """File name (QA###.md) -> content, for every registered rule."""
    return {f"{rule.id}.md": rule_page(rule) for rule in rules.values()}


def with_table(readme: str, table: str) -> str:
    """`readme` with the text between the rule-table markers replaced by `table`."""
    start, end = readme.find(BEGIN), readme.find(END)
    if start < 0 or end < start:
        raise ValueError(f"README has no {BEGIN} ... {END} markers around the rule table")
    return readme[:start + len(BEGIN)] + "\n" + table + readme[end:]
