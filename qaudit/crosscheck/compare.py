"""Module by module: where qaudit's model and the user's Megatron disagree."""

from __future__ import annotations

from dataclasses import asdict, dataclass

from qaudit.crosscheck.facts import COMPARED, RUN_FIELDS, ModuleFacts

ABSENT = "(not built)"


@dataclass(frozen=True)
class Difference:
    module: str
    field: str  # a ModuleFacts field, or "module" when one side does not build it
    qaudit: str
    megatron: str

    def to_dict(self) -> dict[str, str]:
        return asdict(self)


def _normal(field: str, value: object) -> str:
    text = str(value)
    if field == "precision":
        # qaudit labels what it could not execute; the value is the same recipe.
        text = text.replace(" (not executed)", "")
    return text


def compare(ours: list[ModuleFacts], theirs: list[ModuleFacts], ran: bool,
            built_only: frozenset[str] = frozenset()) -> list[Difference]:
    """Differences in qaudit's module order, then modules only upstream builds (its order).
    `ran`: upstream's model was trained too, so the run's fields are compared, except for the
    modules in `built_only`."""
    construction = [f for f in COMPARED if f not in RUN_FIELDS]
    upstream = {facts.name: facts for facts in theirs}
    differences = []
    for facts in ours:
        other = upstream.get(facts.name)
        if other is None:
            differences.append(Difference(facts.name, "module", facts.upstream_class, ABSENT))
            continue
        for field in (COMPARED if ran and facts.name not in built_only else construction):
            mine, its = _normal(field, getattr(facts, field)), _normal(field, getattr(other, field))
            if mine != its:
                differences.append(Difference(facts.name, field, mine, its))
    names = {facts.name for facts in ours}
    differences.extend(Difference(facts.name, "module", ABSENT, facts.upstream_class)
                       for facts in theirs if facts.name not in names)
    return differences
