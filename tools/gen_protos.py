"""Regenerate the checked-in Python code for protos/ into libs/api/src.

Uses the pinned generators from the dev dependency group (grpcio-tools'
bundled protoc, mypy-protobuf for .pyi stubs). The proto root is ``protos/``
and the output root is ``libs/api/src``, so the imports protoc emits
(``from openforge.common.v1 import common_pb2``) are right as written.

Usage: ``python tools/gen_protos.py [--check]``. With ``--check`` it generates
into a temporary folder and exits 1 listing every file that differs from the
checked-in code.
"""

from __future__ import annotations

import argparse
import filecmp
import shutil
import sys
import tempfile
from pathlib import Path

from grpc_tools import protoc

ROOT = Path(__file__).resolve().parents[1]
PROTO_ROOT = ROOT / "protos"
OUT_ROOT = ROOT / "libs" / "api" / "src"
PACKAGE = "openforge"


def _well_known_include() -> str:
    import grpc_tools

    return str(Path(grpc_tools.__file__).parent / "_proto")


def generate(out_root: Path) -> None:
    """Runs protoc over every .proto under protos/openforge into ``out_root``."""
    protos = sorted(str(p.relative_to(PROTO_ROOT)) for p in (PROTO_ROOT / PACKAGE).rglob("*.proto"))
    pkg_out = out_root / PACKAGE
    if pkg_out.exists():
        shutil.rmtree(pkg_out)
    out_root.mkdir(parents=True, exist_ok=True)
    bin_dir = Path(sys.executable).parent
    args = [
        "protoc",
        f"--plugin=protoc-gen-mypy={bin_dir / 'protoc-gen-mypy'}",
        f"--plugin=protoc-gen-mypy_grpc={bin_dir / 'protoc-gen-mypy_grpc'}",
        f"-I{PROTO_ROOT}",
        f"-I{_well_known_include()}",
        f"--python_out={out_root}",
        f"--grpc_python_out={out_root}",
        f"--mypy_out={out_root}",
        f"--mypy_grpc_out={out_root}",
        *protos,
    ]
    code = protoc.main(args)
    if code != 0:
        raise SystemExit(f"protoc failed with exit code {code}")
    # Package markers: protoc writes modules only.
    for folder in [pkg_out, *(p for p in pkg_out.rglob("*") if p.is_dir())]:
        (folder / "__init__.py").touch()
    (pkg_out / "py.typed").touch()


def _tree(root: Path) -> dict[str, Path]:
    return {str(p.relative_to(root)): p for p in root.rglob("*") if p.is_file() and "__pycache__" not in p.parts}


def check() -> int:
    """Generates into a temporary folder and compares with the checked-in code."""
    with tempfile.TemporaryDirectory() as tmp:
        fresh_root = Path(tmp)
        generate(fresh_root)
        fresh = _tree(fresh_root / PACKAGE)
        current = _tree(OUT_ROOT / PACKAGE)
        stale = sorted(
            name
            for name in fresh.keys() | current.keys()
            if name not in fresh or name not in current or not filecmp.cmp(fresh[name], current[name], shallow=False)
        )
    if stale:
        print("generated code is stale; run `make protos`:", file=sys.stderr)
        for name in stale:
            print(f"  libs/api/src/{PACKAGE}/{name}", file=sys.stderr)
        return 1
    print(f"generated code is fresh ({len(fresh)} files)")
    return 0


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="fail if checked-in code differs")
    ns = parser.parse_args()
    if ns.check:
        return check()
    generate(OUT_ROOT)
    print(f"generated into {OUT_ROOT.relative_to(ROOT)}/{PACKAGE}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
