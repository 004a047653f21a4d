"""Validate policy files (every rule, every file, one run) and compile them.

`compile_files` returns either a `PolicySet` or the sorted list of problems; the
set's `document` is the canonical JSON form stored with each applied revision,
and `digest` is the SHA-256 of that form, so reformatting or reordering the files
without changing their meaning changes neither.
"""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from controlplane.domain.placement import Placement
from controlplane.policy.documents import parse_document
from controlplane.policy.loader import UNREAD_PREFIXES, RawDocument, load_file, load_text
from controlplane.policy.models import KINDS, DatasetDoc, ReplicationPolicy, Topology
from controlplane.policy.partial import LooseDataset, LoosePolicy, LooseTopology
from controlplane.policy.planner import place
from controlplane.policy.problems import Problem
from controlplane.policy.rules import (
    Regions,
    check_datasets,
    check_policy,
    check_policy_set,
    check_topology,
    check_topology_count,
    topology_regions,
)


@dataclass(frozen=True)
class PolicySet:
    """A valid set of documents: one topology, its policies and declared datasets."""

    topology: Topology
    policies: tuple[ReplicationPolicy, ...]
    datasets: tuple[DatasetDoc, ...]

    @property
    def regions(self) -> dict[str, str]:
        return {r.name: r.jurisdiction for r in self.topology.spec.regions}

    @property
    def declared(self) -> dict[str, dict[str, str]]:
        return {d.metadata.name: dict(d.metadata.labels) for d in self.datasets}

    def document(self) -> dict[str, Any]:
        """Canonical JSON form: what `plan` diffs and what a revision stores."""
        links = {
            "<->".join(sorted(link.between)): link.model_dump(mode="json", exclude={"between"})
            for link in self.topology.spec.links
        }
        return {
            "topology": self.topology.metadata.name,
            "regions": {
                r.name: {"jurisdiction": r.jurisdiction} for r in self.topology.spec.regions
            },
            "links": dict(sorted(links.items())),
            "policies": {
                p.metadata.name: p.spec.model_dump(mode="json", by_alias=True)
                for p in sorted(self.policies, key=lambda p: p.metadata.name)
            },
            "datasets": dict(sorted(self.declared.items())),
        }

    @property
    def digest(self) -> str:
        canonical = json.dumps(self.document(), sort_keys=True, separators=(",", ":"))
        return hashlib.sha256(canonical.encode()).hexdigest()

    def placements(self, known: Mapping[str, Mapping[str, str]]) -> dict[str, Placement]:
        """Placements of the declared datasets and of `known` ones (name -> labels);
        declared labels win over known ones."""
        datasets: dict[str, Mapping[str, str]] = dict(known)
        datasets.update(self.declared)
        return place(self.topology, list(self.policies), datasets)

    @classmethod
    def from_document(cls, doc: Mapping[str, Any]) -> PolicySet:
        """Rebuild the set stored with a revision (to place datasets registered later)."""
        topo = Topology.model_validate(
            {
                "apiVersion": "meridian/v1",
                "kind": "Topology",
                "metadata": {"name": doc["topology"]},
                "spec": {
                    "regions": [
                        {"name": n, "jurisdiction": r["jurisdiction"]}
                        for n, r in doc["regions"].items()
                    ],
                    "links": [
                        {
                            "between": k.split("<->"),
                            **{f: v for f, v in link.items() if v is not None},
                        }
                        for k, link in doc["links"].items()
                    ],
                },
            }
        )
        policies = tuple(
            ReplicationPolicy.model_validate(
                {
                    "apiVersion": "meridian/v1",
                    "kind": "ReplicationPolicy",
                    "metadata": {"name": name},
                    "spec": {k: v for k, v in spec.items() if v is not None},
                }
            )
            for name, spec in doc["policies"].items()
        )
        datasets = tuple(
            DatasetDoc.model_validate(
                {
                    "apiVersion": "meridian/v1",
                    "kind": "Dataset",
                    "metadata": {"name": name, "labels": labels},
                }
            )
            for name, labels in doc["datasets"].items()
        )
        return cls(topo, policies, datasets)


def check_documents(
    raws: Sequence[RawDocument], read_problems: Sequence[Problem], first_file: str
) -> tuple[PolicySet | None, list[Problem]]:
    """Every rule on every document. Rules also run on what could be parsed of an
    invalid document (see `partial.py`), and skip what they cannot know."""
    problems = list(read_problems)
    checked = [parse_document(raw) for raw in raws]
    topology_kinds: list[tuple[str, int, int]] = []
    kinds_unknown = False
    for doc in checked:
        problems.extend(doc.problems)
        kind = doc.raw.data.get("kind") if isinstance(doc.raw.data, dict) else None
        if kind == "Topology":
            pos = doc.raw.pos(("kind",))
            topology_kinds.append((doc.raw.file, pos.line, pos.column))
        elif kind not in KINDS:
            kinds_unknown = True  # it might have been meant as any kind

    complete = not any(p.message.startswith(UNREAD_PREFIXES) for p in read_problems)
    problems.extend(
        check_topology_count(topology_kinds, first_file, complete=complete and not kinds_unknown)
    )
    topologies = [(d.raw, d.loose) for d in checked if isinstance(d.loose, LooseTopology)]
    policies = [(d, d.loose) for d in checked if isinstance(d.loose, LoosePolicy)]
    datasets = [(d.raw, d.loose) for d in checked if isinstance(d.loose, LooseDataset)]
    regions: Regions | None = None
    if len(topologies) == 1 and len(topology_kinds) == 1:
        problems.extend(check_topology(*topologies[0]))
        regions = topology_regions(*topologies[0])
    for doc, loose_policy in policies:
        problems.extend(check_policy(doc.raw, loose_policy, doc.blanked, regions))
    problems.extend(check_policy_set([(d.raw, p) for d, p in policies]))
    raw_policies = sum(
        1
        for d in checked
        if isinstance(d.raw.data, dict) and d.raw.data.get("kind") == "ReplicationPolicy"
    )
    # A policy that could not be read might select a dataset: do not claim that none does.
    problems.extend(
        check_datasets(
            datasets,
            [p for _, p in policies],
            all_policies=complete and not kinds_unknown and raw_policies == len(policies),
        )
    )

    problems = sorted(set(problems))
    models = [d.model for d in checked]
    if problems or any(m is None for m in models):
        if not problems:  # cannot happen: a document without a model has a problem
            raise RuntimeError("a document failed to parse without a reported problem")
        return None, problems
    topology = [m for m in models if isinstance(m, Topology)]
    return (
        PolicySet(
            topology=topology[0],
            policies=tuple(m for m in models if isinstance(m, ReplicationPolicy)),
            datasets=tuple(m for m in models if isinstance(m, DatasetDoc)),
        ),
        [],
    )


def compile_files(paths: Sequence[Path]) -> tuple[PolicySet | None, list[Problem]]:
    """Load and check every file; all problems of all files are reported together."""
    # A file named twice (`*.yaml prod.yaml`, or once through a symlink) is read once:
    # its one Topology is not "more than one".
    files: dict[str, Path] = {}
    for path in paths:
        files.setdefault(os.path.realpath(path), path)
    raws: list[RawDocument] = []
    read_problems: list[Problem] = []
    for path in files.values():
        docs, found = load_file(path)
        raws.extend(docs)
        read_problems.extend(found)
    first = str(paths[0]) if paths else "<no files>"
    return check_documents(raws, read_problems, first)


def compile_text(text: str, name: str = "policy.yaml") -> tuple[PolicySet | None, list[Problem]]:
    docs, found = load_text(text, name)
    return check_documents(docs, found, name)
