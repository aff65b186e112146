"""deploy/kubernetes: every manifest valid against the Kubernetes schemas
(``kubernetes-validate`` ships them, so this runs offline), and the shape the
cluster needs: replicated control plane, privileged nodes on a host data dir,
probes on /healthz, resource requests, secrets from Secrets."""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import kubernetes_validate
import pytest
import yaml

ROOT = Path(__file__).resolve().parents[3]
KUBERNETES = ROOT / "deploy" / "kubernetes"
#: The oldest Kubernetes still commonly run, and the newest the package knows.
VERSIONS = ["1.28", kubernetes_validate.utils.latest_version()]


def manifests() -> list[tuple[str, dict[str, Any]]]:
    found = []
    for path in sorted(KUBERNETES.glob("*.yaml")):
        if path.name == "kustomization.yaml":
            continue
        for document in yaml.safe_load_all(path.read_text()):
            if document:
                found.append((path.name, document))
    return found


def resources(kind: str) -> list[dict[str, Any]]:
    return [doc for _, doc in manifests() if doc["kind"] == kind]


def one(kind: str, name: str) -> dict[str, Any]:
    (found,) = [doc for doc in resources(kind) if doc["metadata"]["name"] == name]
    return found


def containers(kind: str, name: str) -> list[dict[str, Any]]:
    return list(one(kind, name)["spec"]["template"]["spec"]["containers"])


@pytest.mark.parametrize("version", VERSIONS)
def test_every_manifest_is_valid_against_the_kubernetes_schemas(version: str) -> None:
    docs = manifests()
    assert len(docs) >= 9
    for filename, doc in docs:
        try:
            # strict: an unknown or misspelt field is an error, not ignored.
            kubernetes_validate.validate(doc, version, strict=True)
        except kubernetes_validate.ValidationError as exc:
            path = ".".join(str(p) for p in exc.path)
            pytest.fail(
                f"{filename} {doc['kind']}/{doc['metadata']['name']}: {path}: {exc.message}"
            )


def test_the_validation_refuses_a_broken_manifest() -> None:
    """The check above can fail: a misspelt field and a wrong type are caught."""
    deployment = one("Deployment", "podbay-control")
    misspelt = copy.deepcopy(deployment)
    misspelt["spec"]["replica"] = 2
    wrong_type = copy.deepcopy(deployment)
    wrong_type["spec"]["replicas"] = "two"
    for broken in (misspelt, wrong_type):
        with pytest.raises(kubernetes_validate.ValidationError):
            kubernetes_validate.validate(broken, VERSIONS[-1], strict=True)


def test_kustomization_lists_every_manifest_and_both_images() -> None:
    kustomization = yaml.safe_load((KUBERNETES / "kustomization.yaml").read_text())
    listed = set(kustomization["resources"])
    assert listed == {p.name for p in KUBERNETES.glob("*.yaml")} - {"kustomization.yaml"}
    overridable = {image["name"] for image in kustomization["images"]}
    used = {
        c["image"]
        for kind in ("Deployment", "DaemonSet")
        for d in resources(kind)
        for c in d["spec"]["template"]["spec"]["containers"]
    }
    assert used == {"podbay-control", "podbay-node"} <= overridable


def test_everything_lives_in_the_podbay_namespace() -> None:
    assert one("Namespace", "podbay")
    kustomization = yaml.safe_load((KUBERNETES / "kustomization.yaml").read_text())
    assert kustomization["namespace"] == "podbay"


def test_control_plane_is_replicated_unprivileged_and_probed() -> None:
    deployment = one("Deployment", "podbay-control")
    assert deployment["spec"]["replicas"] >= 2
    (control,) = containers("Deployment", "podbay-control")
    assert control["args"][0] == "control"
    for probe in ("readinessProbe", "livenessProbe"):
        assert control[probe]["httpGet"]["path"] == "/healthz"
    assert control["resources"]["requests"]["cpu"]
    assert control["resources"]["requests"]["memory"]
    assert control["securityContext"]["allowPrivilegeEscalation"] is False
    assert "privileged" not in control["securityContext"]
    pod = deployment["spec"]["template"]["spec"]
    assert pod["securityContext"]["runAsNonRoot"] is True
    # The Service selects the Deployment's pods, on the port the container serves.
    service = one("Service", "podbay-control")
    assert service["spec"]["selector"].items() <= pod_labels(deployment).items()
    assert service["spec"]["ports"][0]["targetPort"] == control["ports"][0]["name"]
    budget = one("PodDisruptionBudget", "podbay-control")
    assert budget["spec"]["minAvailable"] >= 1


def pod_labels(workload: dict[str, Any]) -> dict[str, str]:
    return dict(workload["spec"]["template"]["metadata"]["labels"])


def test_node_is_privileged_with_its_data_dir_and_the_hosts_dev_on_the_host() -> None:
    daemonset = one("DaemonSet", "podbay-node")
    pod = daemonset["spec"]["template"]["spec"]
    (node,) = pod["containers"]
    assert node["args"][0] == "node"
    assert node["securityContext"]["privileged"] is True
    volumes = {v["name"]: v for v in pod["volumes"]}
    mounts = {m["mountPath"]: m for m in node["volumeMounts"]}
    data_dir = node["args"][node["args"].index("--data-dir") + 1]
    assert volumes[mounts[data_dir]["name"]]["hostPath"]["path"] == data_dir
    # The host's /dev itself: loop devices (sandbox disks) appear there as made.
    assert volumes[mounts["/dev"]["name"]]["hostPath"]["path"] == "/dev"
    for probe in ("startupProbe", "readinessProbe"):
        assert node[probe]["httpGet"]["path"] == "/healthz"
    assert node["resources"]["requests"]["cpu"]
    assert node["resources"]["requests"]["memory"]
    # The advertised URL is the host's address on the port the node listens on.
    env = {e["name"]: e for e in node["env"]}
    port = node["args"][node["args"].index("--listen") + 1].rpartition(":")[2]
    assert env["PODBAY_NODE_ADVERTISE_URL"]["value"] == f"http://$(HOST_IP):{port}"
    assert env["HOST_IP"]["valueFrom"]["fieldRef"]["fieldPath"] == "status.hostIP"
    assert pod["hostNetwork"] is True


def test_secrets_come_from_secrets_never_from_plain_values() -> None:
    secret_keys = {
        (s["metadata"]["name"], key) for s in resources("Secret") for key in s["stringData"]
    }
    for kind, name in [("Deployment", "podbay-control"), ("DaemonSet", "podbay-node")]:
        for container in containers(kind, name):
            env = {e["name"]: e for e in container["env"]}
            for secret in ("PODBAY_STORE_URL", "PODBAY_CLUSTER_ENROLLMENT_TOKEN"):
                if secret not in env:
                    continue
                ref = env[secret]["valueFrom"]["secretKeyRef"]
                assert (ref["name"], ref["key"]) in secret_keys
    control_env = {e["name"] for e in containers("Deployment", "podbay-control")[0]["env"]}
    node_env = {e["name"] for e in containers("DaemonSet", "podbay-node")[0]["env"]}
    assert {"PODBAY_STORE_URL", "PODBAY_CLUSTER_ENROLLMENT_TOKEN"} <= control_env
    assert "PODBAY_CLUSTER_ENROLLMENT_TOKEN" in node_env
    assert "PODBAY_STORE_URL" not in node_env  # nodes never touch the store
    config = one("ConfigMap", "podbay")["data"]
    assert not {k for k in config if "TOKEN" in k or "STORE_URL" in k or "PASSWORD" in k}


def test_postgres_statefulset_keeps_its_data_on_a_volume_claim() -> None:
    statefulset = one("StatefulSet", "podbay-postgres")
    claim = statefulset["spec"]["volumeClaimTemplates"][0]
    (postgres,) = containers("StatefulSet", "podbay-postgres")
    assert claim["metadata"]["name"] in {m["name"] for m in postgres["volumeMounts"]}
    assert postgres["readinessProbe"]
    assert postgres["resources"]["requests"]
    # The store URL the control plane gets names this service.
    (cluster,) = [s for s in resources("Secret") if s["metadata"]["name"] == "podbay-cluster"]
    assert "@podbay-postgres:5432/" in cluster["stringData"]["store-url"]
