"""Offline checks of the Helm chart (scripts/test-deploy.sh runs them in `make test`).

For the default values and each value set in deploy/helm/ndpipe/ci/: render the chart as `helm template` does (Helm's
own Go code, embedded by helm-python-sdk), validate every manifest against the Kubernetes
schemas of KUBE_VERSION (kubernetes-validate, strict: an unknown field fails), and check the
rendered ConfigMap's ndpipe.toml with `ndpipe config check`. `helm lint --strict` must report
no warning or error with each. The manifests must keep the chart's promises (pods per
PipeStore count, probes, the PodDisruptionBudget, ...: `shape`). Then the checks must fail where they should: an unknown config key, a
key the chart sets itself, a chart value its schema (values.schema.json) does not know, a
manifest with a wrong field.

    python scripts/check_chart.py NDPIPE_BINARY
"""

import copy
import subprocess
import sys
import tempfile
from pathlib import Path

import helm_python as helm
import kubernetes_validate
import yaml

ROOT = Path(__file__).resolve().parent.parent
CHART = ROOT / "deploy/helm/ndpipe"
KUBE_VERSION = "1.37.0"
RELEASE, NAMESPACE = "photos", "ndpipe"
LINT_WARNING = 2  # Helm's severities: 1 info, 2 warning, 3 error


def render(chart, values):
    """Every manifest the chart renders with `values`, as parsed YAML documents."""
    out = chart.render(values, name=RELEASE, namespace=NAMESPACE, is_install=True)
    docs = []
    for path, text in sorted(out.items()):
        if not path.endswith((".yaml", ".yml")):
            continue
        for doc in yaml.safe_load_all(text):
            if doc:
                docs.append((path, doc))
    return docs


def validate(docs):
    """Validates each manifest against the schemas; returns the problems, one line each."""
    problems = []
    for path, doc in docs:
        name = f"{path}: {doc.get('kind')} {doc.get('metadata', {}).get('name')}"
        try:
            kubernetes_validate.validate(doc, KUBE_VERSION, strict=True)
        except kubernetes_validate.ValidationError as e:
            where = ".".join(str(p) for p in e.path)
            problems.append(f"{name}: {where}: {e.message}")
        except kubernetes_validate.SchemaNotFoundError as e:
            problems.append(f"{name}: {e.message}")
    return problems


def find(docs, kind, suffix):
    """The one manifest of `kind` whose name ends with `suffix`, or None."""
    found = [d for _, d in docs if d["kind"] == kind and d["metadata"]["name"].endswith(suffix)]
    return found[0] if len(found) == 1 else None


def shape(values, docs):
    """What the chart promises beyond valid manifests; returns the broken promises."""
    problems = []
    sts = find(docs, "StatefulSet", "-pipestore")
    if sts is None:
        return ["no PipeStore StatefulSet"]
    count = values.get("pipestore", {}).get("count", 3)
    pod = sts["spec"]["template"]
    container = pod["spec"]["containers"][0]
    env = {e["name"]: e for e in container["env"]}
    checks = [
        (sts["spec"]["replicas"] == count, f"{count} PipeStore pods"),
        (sts["spec"]["volumeClaimTemplates"][0]["metadata"]["name"] == "data", "a volume claim per pod"),
        (sts["spec"]["updateStrategy"]["type"] == "RollingUpdate", "rolling updates"),
        (env.get("NDPIPE_NODE_NAME", {}).get("valueFrom", {}).get("fieldRef", {}).get("fieldPath")
         == "metadata.name", "the pod's name as the node's name"),
        ("secretKeyRef" in env.get("NDPIPE_CATALOG", {}).get("valueFrom", {}), "the catalog from a Secret"),
        (container["readinessProbe"]["httpGet"]["path"] == "/readyz", "readiness on /readyz"),
        (container["livenessProbe"]["httpGet"]["path"] == "/healthz", "liveness on /healthz"),
        (pod["metadata"]["annotations"].get("prometheus.io/scrape") == "true", "scrape annotations"),
        ("podAntiAffinity" in pod["spec"].get("affinity", {}), "anti-affinity"),
        ((find(docs, "PodDisruptionBudget", "-pipestore") or {}).get("spec", {}).get("maxUnavailable") == 1,
         "a PodDisruptionBudget of maxUnavailable 1"),
        ((find(docs, "Deployment", "-gateway") is not None) == values.get("gateway", {}).get("enabled", False),
         "a gateway exactly when enabled"),
        ((find(docs, "StatefulSet", "-postgresql") is not None)
         == values.get("postgresql", {}).get("enabled", True), "PostgreSQL in the chart exactly when enabled"),
        (find(docs, "StatefulSet", "-tuner") is not None, "a Tuner"),
    ]
    gpu = values.get("pipestore", {}).get("gpu", {}).get("enabled", False)
    limits = container.get("resources", {}).get("limits", {})
    checks.append((("nvidia.com/gpu" in limits) == gpu, "a GPU request exactly when enabled"))
    tls = values.get("tls", {}).get("enabled", False)
    checks.append((env["NDPIPE_ADVERTISE_URL"]["value"].startswith("https://" if tls else "http://"),
                   "https:// advertised URLs exactly with TLS"))
    toml = find(docs, "ConfigMap", "-config")["data"]["ndpipe.toml"]
    checks.append(("postgres://" not in toml, "no catalog URL in the ConfigMap"))
    return [f"the chart does not give {what}" for ok, what in checks if not ok]


def config_check(ndpipe, docs):
    """Runs `ndpipe config check` on the rendered ndpipe.toml; returns (exit code, output)."""
    maps = [d for _, d in docs if d["kind"] == "ConfigMap" and "ndpipe.toml" in d.get("data", {})]
    if len(maps) != 1:
        return 1, f"expected one ConfigMap with ndpipe.toml, found {len(maps)}"
    with tempfile.NamedTemporaryFile("w", suffix=".toml") as f:
        f.write(maps[0]["data"]["ndpipe.toml"])
        f.flush()
        run = subprocess.run([ndpipe, "config", "check", f.name], capture_output=True, text=True)
    return run.returncode, run.stdout + run.stderr


def check_value_set(chart, ndpipe, name, values):
    linted = lint(values, name)
    docs = render(chart, values)
    kinds = sorted({d["kind"] for _, d in docs})
    problems = validate(docs) + shape(values, docs)
    code, out = config_check(ndpipe, docs)
    if code != 0:
        problems.append(f"ndpipe config check failed: {out.strip()}")
    status = "ok" if not problems else "FAILED"
    print(f"  {name}: {len(docs)} manifests ({', '.join(kinds)}): {status}")
    for p in problems:
        print(f"    {p}")
    return values, docs, linted and not problems


def expect_failures(chart, ndpipe, values, docs):
    """The checks above must be able to fail; returns the names of those that did not."""
    missed = []
    bad = copy.deepcopy(values)
    bad.setdefault("config", {}).setdefault("pipestore", {})["max_bach"] = 8
    code, out = config_check(ndpipe, render(chart, bad))
    ok = code != 0 and "max_bach" in out
    print(f"  an unknown key (config.pipestore.max_bach) fails ndpipe config check: {ok}")
    if not ok:
        missed.append("unknown config key")

    reserved = copy.deepcopy(values)
    reserved.setdefault("config", {}).setdefault("tuner", {})["listen"] = "0.0.0.0:1"
    try:
        render(chart, reserved)
        ok = False
    except helm.HelmError as e:
        ok = "config.tuner.listen is set by the chart" in str(e)
    print(f"  a key the chart sets (config.tuner.listen) fails the render: {ok}")
    if not ok:
        missed.append("reserved key")

    typo = copy.deepcopy(values)
    typo.setdefault("pipestore", {})["storageClassName"] = "fast"
    try:
        render(chart, typo)
        ok = False
    except helm.HelmError as e:
        ok = "storageClassName" in str(e)
    print(f"  a misplaced chart value (pipestore.storageClassName) fails the values' schema: {ok}")
    if not ok:
        missed.append("chart value")

    broken = copy.deepcopy(docs)
    sts = next(d for _, d in broken if d["kind"] == "StatefulSet")
    sts["spec"]["template"]["spec"]["containers"][0]["volumeMount"] = []
    ok = bool(validate(broken))
    print(f"  a misspelt manifest field (volumeMount) fails kubernetes-validate: {ok}")
    if not ok:
        missed.append("manifest field")
    return missed


def lint(values, name):
    """`helm lint --strict` with `values`: passes with no warning or error."""
    report = helm.lint(str(CHART), values, strict=True, kube_version=KUBE_VERSION)
    bad = [m for m in report["messages"] if m["severity"] >= LINT_WARNING] + report["errors"]
    for m in bad:
        print(f"    {m}")
    print(f"  helm lint --strict ({name}): {len(bad)} warnings or errors")
    return not bad


def main():
    ndpipe = sys.argv[1]
    print(f"chart {CHART.relative_to(ROOT)}, Helm {helm.helm_sdk_version()}, Kubernetes {KUBE_VERSION} schemas")
    files = sorted((CHART / "ci").glob("*-values.yaml"))
    if not files:
        sys.exit("no value sets in deploy/helm/ndpipe/ci")
    sets = [("default values", {})] + [(p.name, yaml.safe_load(p.read_text()) or {}) for p in files]
    with helm.Chart.load(str(CHART)) as chart:
        results = [check_value_set(chart, ndpipe, name, values) for name, values in sets]
        ok = all(r[2] for r in results)
        values, docs, _ = results[0]
        missed = expect_failures(chart, ndpipe, values, docs)
    if missed:
        print(f"  checks that should have failed but did not: {', '.join(missed)}")
    if not ok or missed:
        sys.exit("chart checks failed")
    print(f"chart: {len(sets)} value sets rendered, validated and config-checked")


if __name__ == "__main__":
    main()
