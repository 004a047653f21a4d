"""Generate the Python code of the protobuf contracts (proto/meridian/v1/*.proto).

Run by the build (setup.py's build_py, so `pip install -e .` and every wheel
generate it) and by hand after editing a .proto file:

    python scripts/protogen.py

Writes, into the package `meridian/v1/` beside the committed `__init__.py`: the
messages (`*_pb2.py`) and their typed stubs (`*_pb2.pyi`, mypy-protobuf), the
gRPC service (`agent_pb2_grpc.py` and `.pyi`), and `_generated.py`, which records
the SHA-256 of the sources it was made from, so a test can tell stale code from
fresh. Needs grpcio-tools and mypy-protobuf (build requirements in pyproject.toml).
"""

from __future__ import annotations

import hashlib
import shutil
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PROTO_ROOT = ROOT / "proto"
PACKAGE = Path("meridian") / "v1"
# Files that define a gRPC service get *_pb2_grpc modules; the others would be empty.
SERVICES = ("agent.proto",)
GENERATED_SUFFIXES = ("_pb2.py", "_pb2.pyi", "_pb2_grpc.py", "_pb2_grpc.pyi")


def sources(proto_root: Path = PROTO_ROOT) -> list[Path]:
    return sorted((proto_root / PACKAGE).glob("*.proto"))


def sources_digest(proto_root: Path = PROTO_ROOT) -> str:
    """SHA-256 over the names and bytes of the .proto files, in name order."""
    h = hashlib.sha256()
    for path in sources(proto_root):
        data = path.read_bytes()
        h.update(f"{path.name}\0{len(data)}\0".encode())
        h.update(data)
    return h.hexdigest()


def _plugin(name: str) -> str:
    """The protoc plugin executable `name`, next to this interpreter or on PATH."""
    beside = Path(sys.executable).parent / name
    found = str(beside) if beside.exists() else shutil.which(name)
    if found is None:
        raise SystemExit(
            f"protogen: {name} not found (install mypy-protobuf: it is a build requirement)"
        )
    return found


def generate(out_root: Path = ROOT, proto_root: Path = PROTO_ROOT) -> list[Path]:
    """Generate into out_root/meridian/v1/; return the files written. The files are
    built in a temporary folder first and moved in only when protoc succeeded, so
    a failed run leaves the previous code whole."""
    from grpc_tools import protoc  # a build requirement, not a runtime one

    protos = sources(proto_root)
    if not protos:
        raise SystemExit(f"protogen: no .proto files under {proto_root / PACKAGE}")
    include = Path(protoc.__file__).parent / "_proto"  # google/protobuf/*.proto
    target = out_root / PACKAGE
    with tempfile.TemporaryDirectory(prefix="protogen-") as tmp:
        common = [
            "grpc_tools.protoc",
            f"-I{proto_root}",
            f"-I{include}",
            f"--plugin=protoc-gen-mypy={_plugin('protoc-gen-mypy')}",
            f"--python_out={tmp}",
            f"--mypy_out={tmp}",
        ]
        rel = [str(p.relative_to(proto_root)) for p in protos]
        if protoc.main([*common, *rel]) != 0:
            raise SystemExit("protogen: protoc failed on the messages (see above)")
        services = [str(p.relative_to(proto_root)) for p in protos if p.name in SERVICES]
        grpc_args = [
            "grpc_tools.protoc",
            f"-I{proto_root}",
            f"-I{include}",
            f"--plugin=protoc-gen-mypy_grpc={_plugin('protoc-gen-mypy_grpc')}",
            f"--grpc_python_out={tmp}",
            f"--mypy_grpc_out={tmp}",
        ]
        if services and protoc.main([*grpc_args, *services]) != 0:
            raise SystemExit("protogen: protoc failed on the services (see above)")
        made = Path(tmp) / PACKAGE
        stamp = made / "_generated.py"
        stamp.write_text(
            '"""Written by scripts/protogen.py: the sources this code was generated from."""\n\n'
            f'SOURCES_SHA256 = "{sources_digest(proto_root)}"\n'
        )
        target.mkdir(parents=True, exist_ok=True)
        for old in target.iterdir():
            if old.name.endswith(GENERATED_SUFFIXES):
                old.unlink()
        written: list[Path] = []
        for path in sorted(made.iterdir()):
            dest = target / path.name
            shutil.copyfile(path, dest)
            written.append(dest)
    return written


if __name__ == "__main__":
    for written in generate():
        print(written.relative_to(ROOT))
