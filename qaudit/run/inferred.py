"""The modules observed once for their class, and the ones inferred from them
(docs/observed-once.md): each inferred module is filed with its observed twin's records, so
that its row and every rule see what the twin recorded, and the report says which modules
were inferred and from which."""

from __future__ import annotations

import re

import torch

from qaudit.model.layers import SequentialExperts
from qaudit.model.probe import CallRecord
from qaudit.model.wrappers import AuditedModule
from qaudit.run.rows import index_set_text


_EXPERT = re.compile(r"(.*\.local_experts\.\d+)\.")


def form_classes(model: torch.nn.Module) -> list[SequentialExperts]:
    """Group each sequential-expert layer's experts into classes of identical ones, before
    the run (qaudit/model/identical.py); the layers, model order. Under torchrun the model
    holds this rank's stage only."""
    layers = [m for m in model.modules() if isinstance(m, SequentialExperts)]
    for layer in layers:
        layer.form_classes()
    return layers


def unrun_parameters(layers: list[SequentialExperts]) -> set[int]:
    """The ids of the inferred experts' parameters: they never run, so the training loop gives
    them no gradient buffer or hook (nothing reads one; their rows come from the twin's)."""
    return {id(p) for layer in layers for group in layer.classes for index in group.inferred
            for p in layer.local_experts[index].parameters()}


def inferred_twins(layers: list[SequentialExperts]) -> dict[str, str]:
    """Every inferred audited module's name -> the observed module it copies, model order."""
    twins: dict[str, str] = {}
    for layer in layers:
        experts = layer.local_experts
        for group in layer.classes:
            observed = [m.fqn for m in _audited(experts[group.observed])]
            for index in group.inferred:
                members = [m.fqn for m in _audited(experts[index])]
                twins.update(zip(members, observed, strict=True))
    return twins


def _audited(expert: torch.nn.Module) -> list[AuditedModule]:
    return [m for m in expert.modules() if isinstance(m, AuditedModule)]


def add_inferred_records(records: dict[str, list[CallRecord]], twins: dict[str, str]) -> None:
    """Each inferred module's records are its twin's: the same list of the same records (each
    still names the module that made the call, the observed one). Nothing changes a record
    once the run is over; rows and rules read them by the name they are filed under."""
    for member, twin in twins.items():
        records[member] = records.get(twin, [])


def inferred_classes(layers: list[SequentialExperts]) -> dict[str, dict]:
    """Per class with inferred members, keyed by its observed expert's name: the experts
    inferred from it (`...local_experts.[1-383]`), how many, and how many rows they are."""
    classes = {}
    for layer in layers:
        experts = layer.local_experts
        prefix = _expert_name(experts[0])
        for group in layer.classes:
            if group.inferred:
                classes[f"{prefix}.{group.observed}"] = {
                    "inferred": f"{prefix}.{index_set_text(group.inferred)}",
                    "experts": len(group.inferred),
                    "modules": len(group.inferred) * len(_audited(experts[group.observed]))}
    return classes


def observation(classes: dict[str, dict], rows: list[str]) -> dict | None:
    """What the report says (None when nothing was inferred): how many rows were observed
    and how many inferred, and each class in model order (`rows`: every row's name)."""
    if not classes:
        return None
    first_row: dict[str, int] = {}
    for index, row in enumerate(rows):
        expert = _EXPERT.match(row)
        if expert is not None:
            first_row.setdefault(expert.group(1), index)
    ordered = sorted(classes, key=lambda name: first_row.get(name, 0))
    inferred = sum(entry["modules"] for entry in classes.values())
    return {"modules_observed": len(rows) - inferred, "modules_inferred": inferred,
            "classes": [{"observed": name, **classes[name]} for name in ordered]}


def _expert_name(expert: torch.nn.Module) -> str:
    """`decoder.layers.3.mlp.experts.local_experts` from an expert's first audited module."""
    fqn = _audited(expert)[0].fqn
    head = fqn[:fqn.index(".local_experts.")]
    return f"{head}.local_experts"
