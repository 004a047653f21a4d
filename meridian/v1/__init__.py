"""Generated protobuf and gRPC code of `proto/meridian/v1/` (see `meridian`).

Only this file is committed; the modules beside it come from scripts/protogen.py,
which the build runs.
"""

from pathlib import Path

if not (Path(__file__).parent / "_generated.py").exists():
    raise ImportError(
        "the protobuf code of meridian.v1 has not been generated: run `pip install -e .` "
        "(or `python scripts/protogen.py`) in the repository"
    )
