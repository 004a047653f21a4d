"""`meridian policy validate | plan | apply | schema` (spec/policy.md, spec/cli.md).

Exit statuses: validate 0/1; plan 0 (no change), 2 (changes), 1 (error);
apply 0 (applied or nothing to do), 1 (error or refused).

Publishing: `apply` writes `/meridian/policy/current` in etcd (policy.md), the one
configured (`--etcd` on the command or on `meridian`, MERIDIAN_ETCD) or the default,
as every other command reads it. When etcd cannot be reached the revision stays in
the catalog and the error says to run apply again, which republishes the head.
`--no-publish` records the revision in the catalog only.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer

from controlplane.cli.common import (
    CatalogOpt,
    EtcdOpt,
    Output,
    OutputOpt,
    emit,
    resolve_output,
    settings_from,
)
from controlplane.errors import InvalidInputError

if TYPE_CHECKING:  # each command imports what it needs (see main.Commands)
    from controlplane.policy.compiler import PolicySet
    from controlplane.policy.plan import Change
    from controlplane.policy.publisher import PolicyPublisher

app = typer.Typer(help="Validate, plan and apply replication policy.", no_args_is_help=True)

FilesArg = Annotated[list[Path], typer.Argument(help="policy YAML files", exists=False)]


class PolicyInvalidError(InvalidInputError):
    """The policy files have problems (already printed one per line)."""


PROBLEM_COLUMNS = ["file", "line", "column", "message"]


def _compile(files: list[Path], output: Output | None, *, validating: bool) -> PolicySet:
    """Compile; on problems print them and fail with status 1. They are
    `FILE:LINE:COLUMN: error: MESSAGE` lines on stderr, except for `validate` as JSON
    or CSV: rows on stdout (also when there are none), its shape. `plan` and `apply`
    keep stdout for theirs (cli-output.schema.json), so it stays empty on an error."""
    from controlplane.policy.compiler import compile_files

    policy, problems = compile_files(files)
    fmt = output or Output.table
    as_rows = validating and fmt is not Output.table
    if as_rows:
        emit([p.as_json() for p in problems], fmt, columns=PROBLEM_COLUMNS)
    if problems:
        if not as_rows:
            for problem in problems:
                sys.stderr.write(f"{problem}\n")
        tail = "" if validating else "; nothing was changed"
        raise PolicyInvalidError(
            f"{len(problems)} problem(s) in {len({p.file for p in problems})} file(s){tail}"
        )
    if policy is None:  # compile_files returns a set exactly when there are no problems
        raise PolicyInvalidError("the policy files could not be compiled")
    return policy


@app.command()
def validate(files: FilesArg, output: OutputOpt = None) -> None:
    """Check policy files against every rule; print each problem as FILE:LINE:COLUMN."""
    policy = _compile(files, output, validating=True)
    if (output or Output.table) is Output.table:
        typer.echo(
            f"valid: {len(policy.policies)} polic{'y' if len(policy.policies) == 1 else 'ies'}, "
            f"{len(policy.regions)} regions, {len(policy.datasets)} declared datasets"
        )


def _rows(changes: list[Change]) -> list[dict[str, Any]]:
    return [
        {
            "action": c.action,
            "kind": c.kind,
            "name": c.name,
            "fields": "; ".join(f"{k}: {old!r} -> {new!r}" for k, (old, new) in c.fields.items()),
        }
        for c in changes
    ]


CHANGE_COLUMNS = ["action", "kind", "name", "fields"]


def _print_changes(changes: list[Change], output: Output | None) -> None:
    fmt = resolve_output(output)
    if fmt is Output.json:
        emit([c.as_json() for c in changes], Output.json)
    elif not changes and fmt is Output.table:
        typer.echo("no changes: the catalog matches these files")
    else:
        emit(_rows(changes), fmt, columns=CHANGE_COLUMNS, title="plan")


@app.command()
def plan(
    ctx: typer.Context, files: FilesArg, catalog: CatalogOpt = None, output: OutputOpt = None
) -> None:
    """Show what apply would change. Exit 0: no change, 2: changes, 1: error."""
    from controlplane.catalog.api import open_catalog
    from controlplane.policy.apply import plan_changes

    policy = _compile(files, output, validating=False)
    with open_catalog(settings_from(ctx, catalog=catalog).catalog) as cat:
        changes = plan_changes(cat, policy)
    _print_changes(changes, output)
    raise typer.Exit(2 if changes else 0)


def _publisher(ctx: typer.Context, etcd: str | None, publish: bool) -> PolicyPublisher | None:
    """The etcd the revision is published to (policy.md: apply publishes it), the
    configured one or the default, as every other command reads it; none with
    --no-publish (the catalog alone: a revision prepared before etcd is up)."""
    if not publish:
        return None
    from controlplane.policy.publisher import EtcdPolicyPublisher

    settings = settings_from(ctx, etcd=etcd)
    return EtcdPolicyPublisher(settings.etcd_endpoints, settings.etcd_timeout_s)


def _confirm(question: str, action: str) -> None:
    """Ask on the terminal; refuse (like the runbooks) when stdin is not one, so that a
    piped `yes` or a CI job never applies policy without an explicit --yes."""
    if not sys.stdin.isatty():
        raise InvalidInputError(
            f"{action} needs confirmation: pass --yes when not on a terminal; nothing was changed"
        )
    try:
        agreed = typer.confirm(question, err=True)
    except typer.Abort:
        sys.stderr.write("\n")  # end of input: the prompt's line was never ended
        raise
    if not agreed:
        raise typer.Abort()


@app.command()
def apply(
    ctx: typer.Context,
    files: FilesArg,
    catalog: CatalogOpt = None,
    etcd: EtcdOpt = None,
    yes: Annotated[bool, typer.Option("--yes", "-y", help="do not ask for confirmation")] = False,
    publish: Annotated[
        bool,
        typer.Option(
            "--publish/--no-publish",
            help="write /meridian/policy/current to etcd (default); --no-publish records "
            "the revision in the catalog only, and a later apply publishes it",
        ),
    ] = True,
    output: OutputOpt = None,
) -> None:
    """Apply policy files to the catalog as one revision, and publish it to etcd."""
    from controlplane.catalog.api import open_catalog
    from controlplane.policy.apply import apply_policy, describe_source, plan_changes

    policy = _compile(files, output, validating=False)
    publisher = _publisher(ctx, etcd, publish)
    fmt = resolve_output(output)
    with open_catalog(settings_from(ctx, catalog=catalog).catalog) as cat:
        changes = plan_changes(cat, policy)
        if changes and not yes:
            # The plan goes to stderr with the question, so stdout keeps one document.
            for row in _rows(changes):
                typer.echo(
                    f"  {row['action']} {row['kind']} {row['name']}: {row['fields']}", err=True
                )
            _confirm(f"apply these {len(changes)} change(s)?", f"applying {len(changes)} change(s)")
        result = apply_policy(
            cat,
            policy,
            source=describe_source(files),
            publisher=publisher,
            confirmed=None if yes else changes,  # what was shown (an empty plan too)
        )
    if fmt is Output.json:
        emit(
            {
                "revision": result.revision,
                "digest": result.digest,
                "applied_at": result.applied_at.isoformat().replace("+00:00", "Z"),
                "changes": [c.as_json() for c in result.changes],
                "published": result.published,
            },
            Output.json,
        )
        return
    if fmt is Output.csv:
        # One row per applied change (none when there was nothing to do).
        emit(
            [
                {**row, "revision": result.revision, "digest": result.digest}
                for row in _rows(result.changes)
            ],
            Output.csv,
            columns=["revision", "digest", *CHANGE_COLUMNS],
        )
        return
    where = " and published it to etcd" if result.published else ""
    if result.changes:
        typer.echo(
            f"applied revision {result.revision} ({len(result.changes)} change(s), "
            f"digest {result.digest[:12]}){where}"
        )
    else:
        typer.echo(f"nothing to do: revision {result.revision} is current{where}")


@app.command()
def schema(output: OutputOpt = None) -> None:
    """Print the JSON Schema of policy documents, for editors (JSON only).

    Save it (`meridian policy schema > meridian-policy.schema.json`) and start each
    policy file with `# yaml-language-server: $schema=meridian-policy.schema.json`.
    """
    if output not in (None, Output.json):
        raise InvalidInputError(
            f"policy schema prints a JSON Schema, which has no {output} form: "
            "use --output json or leave --output out"
        )
    from pydantic import TypeAdapter

    from controlplane.policy.models import Document

    doc = TypeAdapter(Document).json_schema(by_alias=True)
    doc["$schema"] = "https://json-schema.org/draft/2020-12/schema"
    doc["title"] = "Meridian policy document"
    sys.stdout.write(json.dumps(doc, indent=2) + "\n")
