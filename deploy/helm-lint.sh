#!/usr/bin/env bash
# `make helm-lint`: the chart, offline. helm lint --strict, then every manifest `helm template`
# renders validated with `kubernetes-validate --strict` (bundled schemas, unknown fields rejected),
# for the default values and for values-production.yaml (5 nodes, ServiceMonitor, TLS + tokens + ACL from Secrets).
# kubernetes-validate has no schema for the ServiceMonitor CRD: it is reported as a warning, and
# the test tests/deploy/test_chart.py checks that object's fields instead.
# Usage: deploy/helm-lint.sh HELM KUBERNETES_VALIDATE
set -euo pipefail
HELM=$1
KV=$2
CHART=helm/raftbroker
out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT
for values in "" "$CHART/values-production.yaml"; do
  name=${values:+production}; name=${name:-default}
  args=(); [ -n "$values" ] && args=(-f "$values")
  echo "helm-lint: $name values"
  "$HELM" lint --strict "$CHART" "${args[@]}"
  "$HELM" template rb "$CHART" --namespace brokers "${args[@]}" >"$out/$name.yaml"
  "$KV" --strict --quiet "$out/$name.yaml"
  echo "helm-lint: $name: $(grep -c '^kind:' "$out/$name.yaml") objects rendered and valid"
done
