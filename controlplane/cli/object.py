"""`meridian object put | get | ls | rm`: objects through a region's agent (spec/cli.md).

Every command talks to one agent (`--agent ADDR` or `MERIDIAN_AGENT`) with
`agents.client.AgentClient`. Inputs are checked before anything is sent (each file
readable, each key a valid name), so a bad argument among many stores none of
them; a set is committed only once every member is stored, so readers never see
a partial one. Large transfers show a progress bar when stderr is a terminal.
"""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer

from controlplane.cli.common import OutputOpt, emit, settings_from

if TYPE_CHECKING:
    from agents.client import AgentClient, Progress
    from controlplane.domain.version import Version

app = typer.Typer(
    help="Objects: store, read, list and delete through an agent.", no_args_is_help=True
)

AgentOpt = Annotated[
    str | None, typer.Option("--agent", help="the agent's HOST:PORT [MERIDIAN_AGENT]")
]
DatasetOpt = Annotated[str, typer.Option("--dataset", help="the dataset")]
# Below this a transfer is over before a bar would be read.
PROGRESS_MIN_BYTES = 16 * 1024 * 1024
COLUMNS = ["dataset", "key", "version", "op", "size", "digest", "regions"]


def _client(ctx: typer.Context, agent: str | None) -> AgentClient:
    from agents.client import AgentClient
    from controlplane.errors import ConfigError

    address = agent or settings_from(ctx, check_endpoints=False).agent
    if not address:
        raise ConfigError("no agent was given: pass --agent HOST:PORT or set MERIDIAN_AGENT")
    return AgentClient(address)


def _row(dataset: str, key: str, version: Version, regions: list[str]) -> dict[str, Any]:
    return {
        "dataset": dataset,
        "key": key,
        "version": str(version.hlc),
        "op": version.op,
        "size": version.size,
        "digest": "" if version.digest is None else str(version.digest),
        "regions": regions,
    }


# -- put ---------------------------------------------------------------------------------
@app.command()
def put(
    ctx: typer.Context,
    dataset: DatasetOpt,
    args: Annotated[list[str], typer.Argument(help="FILE [KEY], or with --set: FILE...")],
    set_id: Annotated[
        str | None,
        typer.Option("--set", help="store the files as one version set (keys: the paths)"),
    ] = None,
    epoch: Annotated[
        int | None,
        typer.Option("--epoch", help="a critical dataset's epoch (default: the owner's agent's)"),
    ] = None,
    agent: AgentOpt = None,
    output: OutputOpt = None,
) -> None:
    """Store FILE as KEY (default: its name), or several files as one version set."""
    from controlplane.domain.names import check_name
    from controlplane.errors import InvalidInputError

    check_name("dataset", dataset)
    if set_id is None:
        if len(args) > 2:
            raise InvalidInputError(
                f"put takes FILE [KEY] but got {len(args)} arguments; "
                "to store several files as one version set, give --set SET"
            )
        items = [(Path(args[0]), args[1] if len(args) == 2 else Path(args[0]).name)]
    else:
        check_name("set", set_id)
        if set_id == "latest":
            raise InvalidInputError("set 'latest' is reserved; it names the newest complete set")
        items = [(Path(a), a) for a in args]
        twice = sorted({a for a in args if args.count(a) > 1})
        if twice:
            raise InvalidInputError(f"--set {set_id} names {twice[0]} twice")
    for path, key in items:
        check_name("key", key)
        if not path.is_file():
            what = "is not a file" if path.exists() else "does not exist"
            raise InvalidInputError(f"{path} {what}; nothing was stored")
    client = _client(ctx, agent)
    rows = asyncio.run(_put(client, dataset, items, set_id, epoch))
    emit(rows, output, columns=COLUMNS[:-1] + (["set"] if set_id else []))


async def _put(
    client: AgentClient,
    dataset: str,
    items: list[tuple[Path, str]],
    set_id: str | None,
    epoch: int | None,
) -> list[dict[str, Any]]:
    rows: list[dict[str, Any]] = []
    members: dict[str, Any] = {}
    async with client:
        for path, key in items:
            size = (await asyncio.to_thread(path.stat)).st_size
            with _progress(f"put {key}", size) as progress:
                version = await client.put(
                    dataset, key, path, epoch=epoch, set_id=set_id, progress=progress
                )
            members[key] = version.hlc
            row = _row(dataset, key, version, [])
            del row["regions"]
            rows.append(row)
        if set_id is not None:
            committed = await client.commit_set(dataset, set_id, members, epoch=epoch)
            for row in rows:
                row["set"] = f"{committed.id}@{committed.hlc}"
    return rows


# -- get ---------------------------------------------------------------------------------
@app.command()
def get(
    ctx: typer.Context,
    dataset: DatasetOpt,
    args: Annotated[list[str], typer.Argument(help="KEY OUT, or with --set: DIR")],
    version: Annotated[
        str | None, typer.Option("--version", help="the version's HLC (default: the newest)")
    ] = None,
    set_id: Annotated[
        str | None,
        typer.Option("--set", help="'latest' or a set id: write every member under DIR"),
    ] = None,
    agent: AgentOpt = None,
    output: OutputOpt = None,
) -> None:
    """Write KEY to OUT atomically, or every member of a version set under DIR."""
    from controlplane.domain.names import check_name
    from controlplane.errors import InvalidInputError

    check_name("dataset", dataset)
    if set_id is None:
        if len(args) != 2:
            raise InvalidInputError(
                f"get takes KEY OUT but got {len(args)} argument(s); "
                "to read a version set, give --set latest|SET DIR"
            )
        check_name("key", args[0])
        out = Path(args[1])
        if out.is_dir():
            out = out / Path(args[0]).name
        if not out.parent.is_dir():
            raise InvalidInputError(f"cannot write {out}: its folder {out.parent} does not exist")
        client = _client(ctx, agent)
        rows = asyncio.run(_get_one(client, dataset, args[0], out, version))
    else:
        if len(args) != 1 or version is not None:
            raise InvalidInputError(
                "get --set takes one argument, the folder DIR to write the members under "
                "(and no --version: each member's is the set's)"
            )
        folder = Path(args[0])
        if folder.exists() and not folder.is_dir():
            raise InvalidInputError(f"{folder} is not a folder")
        client = _client(ctx, agent)
        rows = asyncio.run(_get_set(client, dataset, set_id, folder, folder.resolve()))
    emit(rows, output, columns=[*COLUMNS[:-1], "path"])


async def _get_one(
    client: AgentClient, dataset: str, key: str, out: Path, version: str | None
) -> list[dict[str, Any]]:
    async with client:
        info = await client.stat(dataset, key, version=version)
        with _progress(f"get {key}", info.version.size) as progress:
            got = await client.get(dataset, key, out, version=info.version.hlc, progress=progress)
    row = _row(dataset, key, got, [])
    del row["regions"]
    return [{**row, "path": str(out)}]


async def _get_set(
    client: AgentClient, dataset: str, set_id: str, folder: Path, root: Path
) -> list[dict[str, Any]]:
    from controlplane.errors import InvalidInputError

    rows: list[dict[str, Any]] = []
    async with client:
        found = await client.get_set(dataset, set_id)
        targets = []
        for member in found.members:
            out = await asyncio.to_thread((root / member.key).resolve)
            if not out.is_relative_to(root):
                raise InvalidInputError(
                    f"set {found.id} has member {member.key!r}, which would be written outside "
                    f"{folder}; nothing was written"
                )
            targets.append((member, out))
        for member, out in targets:
            await asyncio.to_thread(out.parent.mkdir, parents=True, exist_ok=True)
            # Each member at the set's version, so the folder holds one set, never two.
            got = await client.get(dataset, member.key, out, version=member.version)
            row = _row(dataset, member.key, got, [])
            del row["regions"]
            rows.append({**row, "path": str(out), "set": f"{found.id}@{found.hlc}"})
    return rows


# -- ls, rm ------------------------------------------------------------------------------
@app.command("ls")
def ls(
    ctx: typer.Context,
    dataset: DatasetOpt,
    prefix: Annotated[str, typer.Option("--prefix", help="only keys that start with P")] = "",
    agent: AgentOpt = None,
    output: OutputOpt = None,
) -> None:
    """Objects with version, size, digest and the regions that hold it."""
    from controlplane.domain.names import check_name

    check_name("dataset", dataset)
    client = _client(ctx, agent)
    catalog_url = settings_from(ctx, check_endpoints=False).catalog
    rows = asyncio.run(_ls(client, dataset, prefix, catalog_url))
    emit(rows, output, columns=COLUMNS)


async def _ls(
    client: AgentClient, dataset: str, prefix: str, catalog_url: str
) -> list[dict[str, Any]]:
    async with client:
        health = await client.health()
        objects = await client.list(dataset, prefix=prefix)
    holders, problem = await asyncio.to_thread(
        _holders, catalog_url, dataset, [(o.key, str(o.version.hlc)) for o in objects]
    )
    if problem is not None and objects:
        _note(
            f"note: the catalog cannot be read ({problem}); regions show only this agent's "
            f"region ({health.region})"
        )
    rows = []
    for o in objects:
        regions = {health.region} | set(holders.get(o.key, []))
        rows.append(_row(dataset, o.key, o.version, sorted(regions)))
    return rows


def _holders(
    url: str, dataset: str, versions: list[tuple[str, str]]
) -> tuple[dict[str, list[str]], str | None]:
    """Key → regions holding that version, from the catalog's replica rows, and why the
    catalog could not be read (None when it could)."""
    from controlplane.catalog.api import open_catalog
    from controlplane.errors import MeridianError

    if not versions:
        return {}, None
    try:
        catalog = open_catalog(url)
    except MeridianError as exc:
        return {}, str(exc).rstrip(".")
    try:
        return {key: catalog.holders(dataset, key, hlc) for key, hlc in versions}, None
    except MeridianError as exc:
        return {}, str(exc).rstrip(".")
    finally:
        catalog.close()


@app.command()
def rm(
    ctx: typer.Context,
    dataset: DatasetOpt,
    key: Annotated[str, typer.Argument(help="the object to delete")],
    epoch: Annotated[
        int | None,
        typer.Option("--epoch", help="a critical dataset's epoch (default: the owner's agent's)"),
    ] = None,
    agent: AgentOpt = None,
    output: OutputOpt = None,
) -> None:
    """Write a tombstone: a delete version that hides KEY and replicates like a put."""
    from controlplane.domain.names import check_name

    check_name("dataset", dataset)
    check_name("key", key)
    client = _client(ctx, agent)

    async def remove() -> Version:
        async with client:
            return await client.delete(dataset, key, epoch=epoch)

    version = asyncio.run(remove())
    row = _row(dataset, key, version, [])
    del row["regions"]
    emit([row], output, columns=COLUMNS[:-1])


# -- terminal --------------------------------------------------------------------------------
def _note(text: str) -> None:
    import sys

    sys.stderr.write(text + "\n")


class _progress:  # noqa: N801 - used as a function: `with _progress(...) as p`
    """A progress bar on stderr for a transfer of `size` bytes, when stderr is a terminal
    and the transfer is large; otherwise nothing (the callback is None)."""

    def __init__(self, label: str, size: int) -> None:
        import sys

        self._bar: Any = None
        self._task: Any = None
        if size >= PROGRESS_MIN_BYTES and sys.stderr.isatty():
            from rich.console import Console
            from rich.progress import (
                BarColumn,
                DownloadColumn,
                Progress,
                TextColumn,
                TimeRemainingColumn,
                TransferSpeedColumn,
            )

            self._bar = Progress(
                TextColumn("{task.description}"),
                BarColumn(),
                DownloadColumn(),
                TransferSpeedColumn(),
                TimeRemainingColumn(),
                console=Console(stderr=True),
                transient=True,
            )
            self._task = self._bar.add_task(label, total=size)

    def __enter__(self) -> Progress | None:
        if self._bar is None:
            return None
        self._bar.start()
        bar, task = self._bar, self._task

        def advance(done: int, total: int | None) -> None:
            bar.update(task, completed=done, total=total)

        return advance

    def __exit__(self, *exc: object) -> None:
        if self._bar is not None:
            self._bar.stop()
