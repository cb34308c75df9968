"""Build hook: the gRPC stubs (``broker/v1/*_pb2*.py``) are generated from ``proto/`` while building.

Everything else lives in pyproject.toml. ``build_py`` runs ``grpc_tools.protoc`` (pinned in
``[build-system].requires``) so that a wheel built from a plain checkout or from the sdist contains
the stubs without ``make proto``:

- a wheel (or any regular build): the stubs are written into the build directory (``build_lib``),
  never into the source tree;
- an editable install (``pip install -e .``): they are written into the source tree (where the
  editable finder imports ``broker`` from; they are gitignored), as ``make proto`` does.

The repository's ``chaos`` package (the drills, ``raftbroker drill`` through the
``raftbroker.commands`` entry point) is found with ``broker`` so that an editable install of a
checkout can import it, but a regular build leaves it out (:data:`CHECKOUT_ONLY`): the wheel
carries ``broker`` only.
"""

from __future__ import annotations

from pathlib import Path

from setuptools import setup
from setuptools.command.build_py import build_py

ROOT = Path(__file__).resolve().parent
PROTO_DIR = ROOT / "proto"
PROTO_PACKAGE = "broker/v1"
CHECKOUT_ONLY = ("chaos",)  # top-level packages of editable installs only, never in a wheel


def generate_stubs(out_dir: Path) -> list[Path]:
    """Run protoc on every ``proto/broker/v1/*.proto`` into ``out_dir``; returns the files written.

    Raises ``RuntimeError`` when there is no proto file or protoc fails (a wheel without stubs
    would install but not import).
    """
    from importlib.resources import files

    from grpc_tools import protoc  # a build requirement, imported only when building

    protos = sorted((PROTO_DIR / PROTO_PACKAGE).glob("*.proto"))
    if not protos:
        raise RuntimeError(f"no .proto files under {PROTO_DIR / PROTO_PACKAGE}")
    (out_dir / PROTO_PACKAGE).mkdir(parents=True, exist_ok=True)
    well_known = str(files("grpc_tools") / "_proto")
    args = ["grpc_tools.protoc", f"-I{PROTO_DIR}", f"-I{well_known}", f"--python_out={out_dir}",
            f"--pyi_out={out_dir}", f"--grpc_python_out={out_dir}", *(str(p) for p in protos)]
    if protoc.main(args) != 0:
        raise RuntimeError(f"grpc_tools.protoc failed on {[p.name for p in protos]}")
    written = []
    for proto in protos:
        for suffix in ("_pb2.py", "_pb2.pyi", "_pb2_grpc.py"):
            path = out_dir / PROTO_PACKAGE / f"{proto.stem}{suffix}"
            if not path.is_file():
                raise RuntimeError(f"protoc did not write {path}")
            written.append(path)
    return written


class BuildPyWithStubs(build_py):
    """``build_py`` that also generates the gRPC stubs (see the module docstring)."""

    def finalize_options(self) -> None:
        super().finalize_options()
        if not self.editable_mode and self.packages:
            self.packages = [p for p in self.packages if p.split(".")[0] not in CHECKOUT_ONLY]

    def run(self) -> None:
        super().run()
        out_dir = ROOT if self.editable_mode else Path(self.build_lib)
        self._stubs = [str(p) for p in generate_stubs(out_dir)]

    def get_outputs(self, include_bytecode: bool = True) -> list[str]:
        outputs = list(super().get_outputs(include_bytecode))
        if self.editable_mode:  # the stubs went into the source tree, not into this build's outputs
            return outputs
        return outputs + [p for p in getattr(self, "_stubs", []) if p not in outputs]


setup(cmdclass={"build_py": BuildPyWithStubs})
