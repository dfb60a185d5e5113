#!/usr/bin/env bash
# Checks every manifest under examples/kubernetes/, offline:
#   - each document against the Kubernetes API schemas (PyPI kubernetes-validate, which ships
#     them; --strict: an unknown field is an error). Istio's EnvoyFilter has no schema there: it
#     is reported as not validated;
#   - each limits file inside a ConfigMap with `turnstile check` (the keys ending in .yaml/.yml,
#     written out as the mounted directory would hold them); a ConfigMap labelled
#     `app.kubernetes.io/component: xds-overlay` is an xDS overlay, checked as
#     TURNSTILE_XDS_OVERLAY;
#   - each Kuadrant `Limitador` resource: its `spec.image` set, and its `spec.limits` (the file
#     limitador-operator writes for the image) with the binary invoked as `limitador-server
#     --validate`;
#   - Envoy Gateway's own config (a ConfigMap's `envoy-gateway.yaml`): an EnvoyGateway whose
#     rateLimitDeployment's TURNSTILE_XDS_OVERLAY is a mounted volume of an overlay ConfigMap here;
#   - what a production team expects of each Deployment's and StatefulSet's pods: readiness and liveness probes,
#     resource requests and a memory limit, non-root, no privilege escalation, read-only root
#     file system, all capabilities dropped, no service-account token; a PodDisruptionBudget for
#     each Deployment of more than one replica; a NetworkPolicy selecting each Deployment's pods,
#     whose ingress ports are ports those pods declare (by name or number).
#
#   scripts/check-kubernetes-examples.sh [TURNSTILE_BINARY]   (default: target/release/turnstile,
#                                                             else target/debug/turnstile)
set -euo pipefail
cd "$(dirname "$0")/.."

dir=examples/kubernetes
bin="${1:-}"
if [ -z "$bin" ]; then
  for b in target/release/turnstile target/debug/turnstile; do
    [ -x "$b" ] && { bin="$b"; break; }
  done
fi
[ -n "$bin" ] && [ -x "$bin" ] || {
  echo "check-kubernetes-examples: no turnstile binary (cargo build first, or pass its path)" >&2
  exit 1
}
command -v kubernetes-validate >/dev/null 2>&1 || {
  echo "check-kubernetes-examples: kubernetes-validate is missing (scripts/install-test-deps.sh installs it)" >&2
  exit 1
}

mapfile -t manifests < <(find "$dir" -name '*.yaml' -o -name '*.yml' | sort)
[ "${#manifests[@]}" -gt 0 ] || { echo "check-kubernetes-examples: no manifests in $dir" >&2; exit 1; }

echo "check-kubernetes-examples: schemas (kubernetes-validate --strict)"
kubernetes-validate --strict --quiet "${manifests[@]}"

# Which python runs kubernetes-validate: it has PyYAML.
py="$(head -n1 "$(command -v kubernetes-validate)" | sed -n 's/^#!//p')"
case "$py" in *python*) ;; *) py=python3 ;; esac
"$py" -c 'import yaml' 2>/dev/null || py=python3

work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT

"$py" - "$work" "${manifests[@]}" <<'EOF'
import os, sys, yaml

work, files = sys.argv[1], sys.argv[2:]
problems = []
deployments, pdbs, policies = [], [], []
configmaps = 0
overlays, gateways = set(), []
for path in files:
    with open(path) as f:
        docs = [d for d in yaml.safe_load_all(f) if d]
    for doc in docs:
        kind, name = doc.get("kind"), doc.get("metadata", {}).get("name")
        where = f"{path}: {kind}/{name}"
        if kind == "ConfigMap" and "envoy-gateway.yaml" in (doc.get("data") or {}):
            gateways.append((where, yaml.safe_load(doc["data"]["envoy-gateway.yaml"])))
        elif kind == "ConfigMap":
            out = os.path.join(work, f"{configmaps:02d}-{name}")
            os.makedirs(out)
            configmaps += 1
            with open(out + ".source", "w") as s:
                s.write(where)
            labels = doc.get("metadata", {}).get("labels") or {}
            if labels.get("app.kubernetes.io/component") == "xds-overlay":
                overlays.add(name)
                open(out + ".overlay", "w").close()
            for key, value in (doc.get("data") or {}).items():
                if key.endswith((".yaml", ".yml")):
                    with open(os.path.join(out, key), "w") as c:
                        c.write(value)
        elif kind == "Limitador":
            if doc.get("apiVersion") != "limitador.kuadrant.io/v1alpha1":
                problems.append(f"{where}: not a limitador.kuadrant.io/v1alpha1 Limitador")
            if not (doc.get("spec") or {}).get("image"):
                problems.append(f"{where}: no spec.image, so the operator runs its own image")
            out = os.path.join(work, f"{configmaps:02d}-{name}")
            os.makedirs(out)
            configmaps += 1
            with open(out + ".source", "w") as s:
                s.write(where)
            open(out + ".limitador", "w").close()
            with open(os.path.join(out, "limitador-config.yaml"), "w") as c:
                yaml.safe_dump((doc.get("spec") or {}).get("limits") or [], c)
        elif kind in ("Deployment", "StatefulSet"):
            deployments.append((where, doc))
        elif kind == "PodDisruptionBudget":
            pdbs.append(doc)
        elif kind == "NetworkPolicy":
            policies.append((where, doc))


for where, eg in gateways:
    if eg.get("kind") != "EnvoyGateway" or eg.get("apiVersion") != "gateway.envoyproxy.io/v1alpha1":
        problems.append(f"{where}: envoy-gateway.yaml is not a gateway.envoyproxy.io/v1alpha1 EnvoyGateway")
        continue
    rl = ((eg.get("provider") or {}).get("kubernetes") or {}).get("rateLimitDeployment") or {}
    container, pod = rl.get("container") or {}, rl.get("pod") or {}
    env = {e["name"]: e.get("value") for e in container.get("env") or []}
    at = env.get("TURNSTILE_XDS_OVERLAY")
    if not at:
        continue
    mounts = [m for m in container.get("volumeMounts") or []
              if at == m["mountPath"] or at.startswith(m["mountPath"].rstrip("/") + "/")]
    volumes = {v["name"]: v for v in pod.get("volumes") or []}
    sources = [(volumes.get(m["name"]) or {}).get("configMap", {}).get("name") for m in mounts]
    if not any(s in overlays for s in sources):
        problems.append(f"{where}: TURNSTILE_XDS_OVERLAY={at} is no mounted volume of an xds-overlay ConfigMap")


def selects(selector, labels):
    return all(labels.get(k) == v for k, v in (selector or {}).get("matchLabels", {}).items())

for where, d in deployments:
    spec = d["spec"]
    pod = spec["template"]["spec"]
    labels = spec["template"]["metadata"].get("labels", {})
    psc = pod.get("securityContext", {})
    if pod.get("automountServiceAccountToken") is not False:
        problems.append(f"{where}: automountServiceAccountToken is not false")
    for c in pod["containers"]:
        cw = f"{where} container {c['name']}"
        sc = c.get("securityContext", {})
        if not (sc.get("runAsNonRoot") or psc.get("runAsNonRoot")):
            problems.append(f"{cw}: runAsNonRoot is not set")
        if sc.get("allowPrivilegeEscalation") is not False:
            problems.append(f"{cw}: allowPrivilegeEscalation is not false")
        if sc.get("readOnlyRootFilesystem") is not True:
            problems.append(f"{cw}: readOnlyRootFilesystem is not true")
        if "ALL" not in (sc.get("capabilities", {}).get("drop") or []):
            problems.append(f"{cw}: capabilities are not all dropped")
        for probe in ("readinessProbe", "livenessProbe"):
            if probe not in c:
                problems.append(f"{cw}: no {probe}")
        res = c.get("resources", {})
        if not res.get("requests", {}).get("memory") or not res.get("requests", {}).get("cpu"):
            problems.append(f"{cw}: no cpu and memory requests")
        if not res.get("limits", {}).get("memory"):
            problems.append(f"{cw}: no memory limit")
    if spec.get("replicas", 1) > 1:
        covered = any(
            all(labels.get(k) == v for k, v in p["spec"]["selector"].get("matchLabels", {}).items())
            for p in pdbs
        )
        if not covered:
            problems.append(f"{where}: {spec['replicas']} replicas and no PodDisruptionBudget selecting them")
    declared = set()
    for c in pod["containers"]:
        for port in c.get("ports", []):
            declared.add(port["containerPort"])
            if "name" in port:
                declared.add(port["name"])
    fencing = [(pw, p) for pw, p in policies if selects(p["spec"].get("podSelector"), labels)]
    if not fencing:
        problems.append(f"{where}: no NetworkPolicy selects its pods")
    for pw, p in fencing:
        if "Ingress" not in p["spec"].get("policyTypes", ["Ingress"]):
            problems.append(f"{pw}: selects {where} but does not restrict ingress")
        for rule in p["spec"].get("ingress", []):
            if not rule.get("from") or not rule.get("ports"):
                problems.append(f"{pw}: an ingress rule without `from` or `ports` admits too much")
            for port in rule.get("ports", []):
                if port.get("port") not in declared:
                    problems.append(f"{pw}: port {port.get('port')!r} is not a port of {where}")

print(f"check-kubernetes-examples: {len(deployments)} Deployment(s) and StatefulSet(s), {len(pdbs)} PodDisruptionBudget(s), {len(policies)} NetworkPolicy(ies), {configmaps} ConfigMap(s) of limits or overlays, {len(gateways)} EnvoyGateway config(s)")
for p in problems:
    print(f"check-kubernetes-examples: {p}", file=sys.stderr)
sys.exit(1 if problems else 0)
EOF

for cm in "$work"/*/; do
  cm="${cm%/}"
  if ! compgen -G "$cm/*.y*ml" >/dev/null; then
    continue
  fi
  if [ -e "$cm.limitador" ]; then
    echo "check-kubernetes-examples: limitador-server --validate, $(cat "$cm.source")"
    ln -sf "$(realpath "$bin")" "$work/limitador-server"
    check=("$work/limitador-server" --validate "$cm/limitador-config.yaml")
  elif [ -e "$cm.overlay" ]; then
    echo "check-kubernetes-examples: turnstile check, as an xDS overlay, $(cat "$cm.source")"
    check=(env CONFIG_TYPE=GRPC_XDS_SOTW TURNSTILE_XDS_OVERLAY="$cm" "$bin" check)
  else
    echo "check-kubernetes-examples: turnstile check $(cat "$cm.source")"
    check=("$bin" check --config "$cm")
  fi
  if ! out="$("${check[@]}" 2>&1)"; then
    echo "$out" >&2
    echo "check-kubernetes-examples: the limits in $(cat "$cm.source") fail turnstile check" >&2
    exit 1
  fi
  echo "$out" | sed 's/^/  /'
done
echo "check-kubernetes-examples: OK"
