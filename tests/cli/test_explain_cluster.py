"""``dradriver explain --pod``: assembling a pod's claims from a cluster (through a fake reader)."""

import copy
import gc
import json
from pathlib import Path

import pytest
import yaml

from dradriver.cli.explain_cluster import explain_pod_with, peek_continue, pod_claims, quota_has_room
from dradriver.plugin.cluster import ForbiddenError

ROOT = Path(__file__).resolve().parents[2]


def _load(path):
    return [d for d in yaml.safe_load_all((ROOT / path).read_text()) if d]


class FakeReader:
    def __init__(self, pod, claims=(), templates=(), taint_rules=(), events=(), *, quotas=()):
        self.pod = pod
        self.quotas = {(q["metadata"]["namespace"], q["metadata"]["name"]): q for q in quotas}
        self.refused = {}  # what the reader may not read: method name -> the error it raises
        self.taint_rules = list(taint_rules)
        self.events = list(events)
        self.claims = {(c["metadata"]["namespace"], c["metadata"]["name"]): c for c in claims}
        self.templates = {(t["metadata"]["namespace"], t["metadata"]["name"]): t for t in templates}

    def get_pod(self, namespace, name):
        return self.pod

    def get_claim(self, namespace, name):
        return self.claims.get((namespace, name))

    def get_claim_template(self, namespace, name):
        return self.templates.get((namespace, name))

    def list_device_classes(self):
        return [d for f in sorted((ROOT / "manifests/deviceclasses").glob("*.yaml")) for d in _load(f)]

    def list_resource_slices(self):
        return _load("tests/fixtures/slices/dgx-a100-80gb.yaml")

    def list_claims(self):
        return list(self.claims.values())

    def list_device_taint_rules(self):
        return self.taint_rules

    def get_resource_quota(self, namespace, name):
        if "get_resource_quota" in self.refused:
            raise self.refused["get_resource_quota"]
        return self.quotas.get((namespace, name))

    def list_pod_events(self, namespace, pod_uid, reason):
        if "list_pod_events" in self.refused:
            raise self.refused["list_pod_events"]
        return [e for e in self.events if e["involvedObject"]["uid"] == pod_uid and e["reason"] == reason]


def pod(*entries, statuses=()):
    return {
        "metadata": {"name": "trainer", "namespace": "ml"},
        "spec": {"resourceClaims": list(entries)},
        "status": {"resourceClaimStatuses": list(statuses)},
    }


def template(count):
    return {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaimTemplate",
        "metadata": {"name": "gpus", "namespace": "ml"},
        "spec": {
            "spec": {
                "devices": {
                    "requests": [{"name": "gpu", "exactly": {"deviceClassName": "gpu.dradriver.dev", "count": count}}]
                }
            }
        },
    }


def allocated_claim(name, devices):
    return {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaim",
        "metadata": {"name": name, "namespace": "ml", "uid": f"uid-{name}"},
        "spec": {"devices": {"requests": [{"name": "r", "exactly": {"deviceClassName": "gpu.dradriver.dev"}}]}},
        "status": {
            "allocation": {
                "devices": {
                    "results": [
                        {"request": "r", "driver": "gpu.dradriver.dev", "pool": "node-a", "device": d} for d in devices
                    ]
                }
            }
        },
    }


def test_a_claim_not_yet_generated_for_an_unscheduled_pod_is_not_called_a_fit(capsys):
    # The template alone fits, but there is no claim for the scheduler to place: the pod is not about to run.
    reader = FakeReader(pod({"name": "gpus", "resourceClaimTemplateName": "gpus"}), templates=[template(2)])
    assert explain_pod_with(reader, "ml/trainer", "text") == 1
    out = capsys.readouterr().out
    assert out.startswith(
        "pod ml/trainer:\nclaim gpus: no ResourceClaim generated yet from ResourceClaimTemplate ml/gpus: "
    ), out
    assert "  what the template asks for, once its claim exists:\n  ResourceClaimTemplate ml/gpus" in out
    assert "could not be read" not in out
    assert explain_pod_with(reader, "ml/trainer", "json") == 1
    [claim] = json.loads(capsys.readouterr().out)["claims"]
    assert (claim["fits"], claim["claimGenerated"], claim["templateFits"]) == (False, False, True)


def test_a_scheduled_pods_template_claim_is_explained_from_the_template(capsys):
    scheduled = pod({"name": "gpus", "resourceClaimTemplateName": "gpus"})
    scheduled["spec"]["nodeName"] = "node-a"
    reader = FakeReader(scheduled, templates=[template(2)])
    assert explain_pod_with(reader, "ml/trainer", "text") == 0
    out = capsys.readouterr().out
    assert "fits on node node-a" in out and "generated yet" not in out


@pytest.mark.parametrize("status", [401, 403])
def test_events_it_may_not_read_are_named_with_the_rbac_for_them(capsys, status):
    stuck = pod({"name": "gpus", "resourceClaimTemplateName": "gpus"})
    stuck["metadata"]["uid"] = "uid-trainer"
    reader = FakeReader(stuck, templates=[template(1)])
    reader.refused["list_pod_events"] = ForbiddenError(
        f"GET Events of pod ml: HTTP {status}: events is forbidden; dradriver explain --pod needs list on events",
        status=status,
    )
    assert explain_pod_with(reader, "ml/trainer", "text") == 1
    out = capsys.readouterr().out
    assert "no ResourceClaim generated yet" in out
    assert (
        "  why it has not been created is not known: the pod's events could not be read: GET Events of pod ml: "
        f"HTTP {status}: events is forbidden; dradriver explain --pod needs list on events\n"
    ) in out
    assert explain_pod_with(reader, "ml/trainer", "json") == 1
    [claim] = json.loads(capsys.readouterr().out)["claims"]
    assert f"HTTP {status}" in claim["eventsUnreadable"]


def test_device_taint_rules_keep_the_devices_they_select_out_as_the_scheduler_does(capsys):
    # Found against the real scheduler (tests/cluster): a rule's taint counts though no slice carries it.
    rule = {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "DeviceTaintRule",
        "metadata": {"name": "maintenance"},
        "spec": {"deviceSelector": {"driver": "gpu.dradriver.dev"}, "taint": {"key": "m", "effect": "NoSchedule"}},
    }
    reader = FakeReader(
        pod({"name": "gpus", "resourceClaimTemplateName": "gpus"}), templates=[template(1)], taint_rules=[rule]
    )
    assert explain_pod_with(reader, "ml/trainer", "text") == 1
    assert "does NOT fit" in capsys.readouterr().out


def test_a_pod_pinned_to_a_node_is_explained_on_that_node_only(capsys):
    # Found against the real scheduler (tests/cluster): it honours the pod's node selector; explain did not.
    pinned = pod({"name": "gpus", "resourceClaimTemplateName": "gpus"})
    pinned["spec"]["nodeSelector"] = {"kubernetes.io/hostname": "node-b"}
    reader = FakeReader(pinned, templates=[template(1)])
    assert explain_pod_with(reader, "ml/trainer", "text") == 1
    reader.pod["spec"] = {**pinned["spec"], "nodeSelector": {}, "nodeName": "node-a"}
    assert explain_pod_with(reader, "ml/trainer", "text") == 0
    assert "fits on node node-a" in capsys.readouterr().out


def test_pending_pod_is_explained_against_other_claims_allocations(capsys):
    taken = allocated_claim("busy", [f"gpu-0000-{b}-00-0" for b in ("07", "0f", "47", "4e", "87", "90", "b7")])
    reader = FakeReader(
        pod({"name": "gpus", "resourceClaimTemplateName": "gpus"}), claims=[taken], templates=[template(2)]
    )
    assert explain_pod_with(reader, "ml/trainer", "json") == 1
    data = json.loads(capsys.readouterr().out)
    hints = data["claims"][0]["report"]["requests"][0]["hints"]
    assert any("allocated to other claims" in h for h in hints)


def test_generated_claim_is_preferred_over_the_template():
    generated = allocated_claim("trainer-gpus-x", ["gpu-0000-07-00-0"])
    reader = FakeReader(
        pod(
            {"name": "gpus", "resourceClaimTemplateName": "gpus"},
            statuses=[{"name": "gpus", "resourceClaimName": "trainer-gpus-x"}],
        ),
        claims=[generated],
        templates=[template(1)],
    )
    (resolved,) = pod_claims(reader, reader.pod)
    assert resolved.obj is generated and not resolved.error


def test_missing_claim_is_an_error_naming_it(capsys):
    reader = FakeReader(pod({"name": "gpus", "resourceClaimName": "nope"}))
    assert explain_pod_with(reader, "ml/trainer", "text") == 2
    assert "ResourceClaim ml/nope does not exist" in capsys.readouterr().err


def test_pod_without_claims_is_not_pending_because_of_dra(capsys):
    reader = FakeReader(pod())
    assert explain_pod_with(reader, "ml/trainer", "text") == 0
    assert "no spec.resourceClaims" in capsys.readouterr().out


def test_allocated_claim_is_reported_as_allocated(capsys):
    claim = copy.deepcopy(allocated_claim("ready", ["gpu-0000-07-00-0"]))
    reader = FakeReader(pod({"name": "gpus", "resourceClaimName": "ready"}), claims=[claim])
    assert explain_pod_with(reader, "ml/trainer", "text") == 0
    assert "already allocated" in capsys.readouterr().out


def claim_creation_event(message, when="2026-11-27T16:00:00Z"):
    return {
        "involvedObject": {"kind": "Pod", "uid": "uid-trainer"},
        "reason": "FailedResourceClaimCreation",
        "lastTimestamp": when,
        "message": message,
    }


# The resource-claim controller's event when the quota admission plugin refused the claim (tests/cluster: real text).
QUOTA_REFUSAL = (
    'PodResourceClaim gpus: create ResourceClaim trainer-gpus-x: resourceclaims.resource.k8s.io "trainer-gpus-x" is '
    "forbidden: exceeded quota: gpus, requested: gpu.dradriver.dev.deviceclass.resource.k8s.io/devices=1, used: "
    "gpu.dradriver.dev.deviceclass.resource.k8s.io/devices=2, limited: gpu.dradriver.dev.deviceclass.resource.k8s.io/"
    "devices=2"
)


GPU_DEVICES = "gpu.dradriver.dev.deviceclass.resource.k8s.io/devices"


def resource_quota(used, hard=2, **more_used):
    """ResourceQuota ml/gpus as the quota controller fills in its status: ``used`` of ``hard`` GPUs."""
    limits = {GPU_DEVICES: str(hard)}
    return {
        "metadata": {"name": "gpus", "namespace": "ml"},
        "spec": {"hard": limits},
        "status": {"hard": limits, "used": {GPU_DEVICES: str(used), **more_used}},
    }


def quota_stuck_reader(*quotas):
    """A pod whose claim the quota refused three times (a webhook once before), and ``quotas``."""
    stuck = pod({"name": "gpus", "resourceClaimTemplateName": "gpus"})
    stuck["metadata"]["uid"] = "uid-trainer"
    older = claim_creation_event(
        "PodResourceClaim gpus: create ResourceClaim x: webhook said no", "2026-11-27T15:00:00Z"
    )
    newest = claim_creation_event(f"(combined from similar events): {QUOTA_REFUSAL}", "2026-11-27T16:01:00Z")
    events = [claim_creation_event(QUOTA_REFUSAL), older, newest]
    return FakeReader(stuck, templates=[template(1)], events=events, quotas=quotas)


def test_a_claim_its_quota_has_no_room_for_is_explained_by_the_quota_not_the_devices(capsys):
    reader = quota_stuck_reader(resource_quota(used=2))
    assert explain_pod_with(reader, "ml/trainer", "text") == 1
    out = capsys.readouterr().out
    assert "no ResourceClaim could be created from ResourceClaimTemplate ml/gpus" in out
    assert "exceeded quota: gpus, requested: gpu.dradriver.dev.deviceclass.resource.k8s.io/devices=1" in out
    assert "\n  last refused at 2026-11-27T16:01:00Z (the pod's newest FailedResourceClaimCreation event)\n" in out
    assert "ResourceQuota ml/gpus has no room" in out and "kubectl describe resourcequota gpus -n ml" in out
    assert explain_pod_with(reader, "ml/trainer", "json") == 1
    [claim] = json.loads(capsys.readouterr().out)["claims"]
    assert claim == {"podClaim": "gpus", "template": "ml/gpus", "fits": False, "quota": "gpus",
                     "notCreated": QUOTA_REFUSAL.partition(": ")[2], "refusedAt": "2026-11-27T16:01:00Z",
                     "quotaNow": "full"}  # fmt: skip


def test_a_quota_with_room_now_says_to_nudge_the_pod_or_wait_for_the_controllers_retry(capsys):
    reader = quota_stuck_reader(resource_quota(used=1))
    assert explain_pod_with(reader, "ml/trainer", "text") == 1  # still no claim: the pod still waits
    out = capsys.readouterr().out
    assert "  ResourceQuota ml/gpus has room for the claim's devices now: the resource claim controller creates" in out
    assert 'kubectl annotate --overwrite pod trainer -n ml retried-at="$(date +%s)"' in out and "has no room" not in out
    assert explain_pod_with(reader, "ml/trainer", "json") == 1
    assert json.loads(capsys.readouterr().out)["claims"][0]["quotaNow"] == "has room"


def test_a_quota_deleted_since_says_so(capsys):
    assert explain_pod_with(quota_stuck_reader(), "ml/trainer", "text") == 1
    out = capsys.readouterr().out
    assert "  ResourceQuota ml/gpus no longer exists: the resource claim controller creates the claim" in out


def test_a_quota_it_may_not_read_is_named_and_the_refusal_still_explained(capsys):
    reader = quota_stuck_reader(resource_quota(used=1))
    reader.refused["get_resource_quota"] = ForbiddenError("GET ResourceQuota ml/gpus: HTTP 403: no", status=403)
    assert explain_pod_with(reader, "ml/trainer", "text") == 1
    out = capsys.readouterr().out
    assert (
        "  ResourceQuota ml/gpus had no room for the claim's devices; whether it has now is not known (cannot read "
        "it: GET ResourceQuota ml/gpus: HTTP 403: no): free some"
    ) in out


@pytest.mark.parametrize(
    ("used", "requested", "room"),
    [
        ({GPU_DEVICES: "1", "requests.nvidia.com/gpu": "1"}, f"{GPU_DEVICES}=1,requests.nvidia.com/gpu=1", True),
        ({GPU_DEVICES: "1", "requests.nvidia.com/gpu": "2"}, f"{GPU_DEVICES}=1,requests.nvidia.com/gpu=1", False),
        ({GPU_DEVICES: "0"}, f"{GPU_DEVICES}=3", False),
        ({}, f"{GPU_DEVICES}=2", True),  # nothing used yet
        ({GPU_DEVICES: "2"}, "mig.dradriver.dev.deviceclass.resource.k8s.io/devices=1", True),  # no limit on it now
    ],
)
def test_quota_room_is_what_the_claim_asked_for_against_each_limit(used, requested, room):
    limits = {GPU_DEVICES: "2", "requests.nvidia.com/gpu": "2"}
    quota = {"spec": {"hard": limits}, "status": {"hard": limits, "used": used}}
    assert quota_has_room(quota, requested) is room


def test_another_refusal_of_the_claim_names_no_quota(capsys):
    stuck = pod({"name": "gpus", "resourceClaimTemplateName": "gpus"})
    stuck["metadata"]["uid"] = "uid-trainer"
    refusal = claim_creation_event("PodResourceClaim gpus: create ResourceClaim x: admission webhook denied it")
    reader = FakeReader(stuck, templates=[template(1)], events=[refusal])
    assert explain_pod_with(reader, "ml/trainer", "text") == 1
    out = capsys.readouterr().out
    assert "admission webhook denied it" in out and "ResourceQuota" not in out


def test_a_created_claim_is_explained_whatever_old_events_say(capsys):
    generated = allocated_claim("trainer-gpus-x", ["gpu-0000-07-00-0"])
    done = pod(
        {"name": "gpus", "resourceClaimTemplateName": "gpus"},
        statuses=[{"name": "gpus", "resourceClaimName": "trainer-gpus-x"}],
    )
    done["metadata"]["uid"] = "uid-trainer"
    reader = FakeReader(done, claims=[generated], templates=[template(1)], events=[claim_creation_event(QUOTA_REFUSAL)])
    assert explain_pod_with(reader, "ml/trainer", "text") == 0
    assert "already allocated" in capsys.readouterr().out


class CollectorWatchingReader(FakeReader):
    """Records whether Python's cyclic garbage collector was on while the slices were read; fails the read of
    claims with ``error`` where one is given."""

    def __init__(self, *args, error=None, **kwargs):
        super().__init__(*args, **kwargs)
        self.collector_on_while_reading = None
        self.error = error

    def list_resource_slices(self):
        self.collector_on_while_reading = gc.isenabled()
        return super().list_resource_slices()

    def list_claims(self):
        if self.error:
            raise self.error
        return super().list_claims()


@pytest.mark.parametrize("error", [None, ForbiddenError("resourceclaims is forbidden", status=403)])
def test_the_cluster_is_read_with_the_collector_paused_and_left_as_it_was(capsys, error):
    """Over a large fleet the collector's scans of every object read cost more than parsing them
    (docs/performance.md): it is off during the read, and on again, nothing left frozen, after explain, also when
    a read fails; a freeze the process made itself is kept."""
    reader = CollectorWatchingReader(pod({"name": "gpus", "resourceClaimTemplateName": "gpus"}),
                                     templates=[template(2)], error=error)  # fmt: skip
    frozen = gc.get_freeze_count()
    assert gc.isenabled()
    if error:
        with pytest.raises(ForbiddenError):
            explain_pod_with(reader, "ml/trainer", "json")
    else:
        assert explain_pod_with(reader, "ml/trainer", "json") == 1  # no claim generated yet from the template
    assert reader.collector_on_while_reading is False
    assert gc.isenabled()
    assert gc.get_freeze_count() == frozen


def test_a_freeze_the_process_made_is_kept(capsys):
    reader = FakeReader(pod({"name": "gpus", "resourceClaimTemplateName": "gpus"}), templates=[template(2)])
    gc.freeze()
    try:
        frozen = gc.get_freeze_count()
        assert explain_pod_with(reader, "ml/trainer", "json") == 1
        assert gc.get_freeze_count() == frozen
    finally:
        gc.unfreeze()


@pytest.mark.parametrize(
    ("page", "token"),
    [
        # The API server's layout: the list's metadata, then its items.
        (b'{"kind":"ResourceSliceList","apiVersion":"resource.k8s.io/v1","metadata":{"resourceVersion":"7",'
         b'"continue":"eyJ2IjoibWV0YS5rOHMuaW8vdjEifQ"},"items":[{"metadata":{"name":"a"}}]}',
         "eyJ2IjoibWV0YS5rOHMuaW8vdjEifQ"),
        # The last page: no token in the metadata; one in an item is not the list's.
        (b'{"metadata":{"resourceVersion":"7"},"items":[{"metadata":{"continue":"no"}}]}', ""),
        # Items first: nothing told from the first bytes (the parsed page gives the token).
        (b'{"items":[],"metadata":{"continue":"abc"}}', ""),
        (b"{}", ""),
    ],
    ids=["api-server", "last-page", "items-first", "empty"],
)  # fmt: skip
def test_the_next_pages_token_is_read_from_the_pages_first_bytes(page, token):
    """explain asks for the next page while it parses this one, with the token read before the items."""
    assert peek_continue(page) == token
