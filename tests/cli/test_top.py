"""`dradriver top`'s table from /allocations documents (lost, unhealthy and MIG-enabled GPUs, a driver of before
they were in the document) and the forms of --address it takes."""

from __future__ import annotations

from typing import Any

import pytest

from dradriver.cli.main import main
from dradriver.cli.top import allocations_url, render

GPU0, GPU1, GPU2 = "gpu-0000-07-00-0", "gpu-0000-0f-00-0", "gpu-0000-47-00-0"
HEALTHY: dict[str, Any] = {"status": "HEALTHY", "message": "", "taints": []}


def _taint(cause: str, value: str, effect: str = "NoSchedule") -> dict[str, str]:
    return {"key": f"gpu.dradriver.dev/{cause}", "value": value, "effect": effect, "timeAdded": "2025-01-01T00:00:00Z"}


def _mig(start: int, profile: str, uuid: str) -> dict[str, Any]:
    name = f"{GPU0}-mig-{profile.replace('.', '')}-{start}"
    return {"name": name, "uuid": uuid, "profile": profile, "gpuInstanceId": start + 1, "health": HEALTHY}


def _document() -> dict[str, Any]:
    """GPU 0 in MIG mode with two MIG devices (the second held), GPU 1 unhealthy (XID 62), GPU 2 lost, and a GPU
    lost before it was ever read (no name)."""
    return {
        "node": "node-a",
        "migMode": "static",
        "gpus": [
            {
                "name": GPU0,
                "uuid": "GPU-0",
                "productName": "NVIDIA A100-SXM4-40GB",
                "index": 0,
                "migEnabled": True,
                "health": HEALTHY,
                "migDevices": [_mig(0, "3g.20gb", "MIG-a"), _mig(6, "1g.5gb", "MIG-b")],
            },
            {
                "name": GPU1,
                "uuid": "GPU-1",
                "productName": "NVIDIA A100-SXM4-40GB",
                "index": 1,
                "migEnabled": False,
                "health": {"status": "UNHEALTHY", "message": "XID 62 on GPU GPU-1", "taints": [_taint("xid", "62")]},
                "migDevices": [],
            },
        ],
        "lostGpus": [
            {
                "index": 2,
                "name": GPU2,
                "uuid": "GPU-2",
                "reason": "GPU is lost",
                "health": {
                    "status": "UNHEALTHY",
                    "message": "GPU GPU-2 is lost",
                    "taints": [_taint("gpu-lost", ""), _taint("xid", "79")],
                },
            },
            {"index": 3, "name": None, "uuid": None, "reason": "GPU is lost"},
        ],
        "allocations": [
            {
                "namespace": "default",
                "pod": "inference-0",
                "claim": "inference",
                "device": f"{GPU0}-mig-1g5gb-6",
                "uuid": "MIG-b",
                "gpu": GPU0,
                "gpuUUID": "GPU-0",
                "migProfile": "1g.5gb",
                "sharing": "exclusive",
            },
            {
                "namespace": "default",
                "pod": "trainer-0",
                "claim": "trainer",
                "device": GPU2,
                "uuid": "GPU-2",
                "gpu": GPU2,
                "gpuUUID": "GPU-2",
                "migProfile": "",
                "sharing": "exclusive",
            },
        ],
        "usage": [],
    }


def _row(lines: list[str], start: str) -> str:
    """The one row of the table whose GPU cell is ``start``, or whose device cell is ``start`` (``└ …``)."""
    [line] = [line for line in lines if line.startswith(start) or (start.startswith("└") and start in line)]
    return line


def test_a_mig_enabled_gpu_lists_every_mig_device_free_or_with_its_holder() -> None:
    lines = render(_document()).splitlines()
    assert lines[0].split() == ["GPU", "DEVICE", "PROFILE", "NAMESPACE/POD", "CLAIM", "SHARING", "HEALTH", "UTIL",
                                "MEMORY"]  # fmt: skip
    assert _row(lines, GPU0).split()[-2:] == ["MIG", "ok"]
    assert _row(lines, "└ mig-3g20gb-0").split()[1:] == ["mig-3g20gb-0", "3g.20gb", "free", "ok"]
    assert _row(lines, "└ mig-1g5gb-6").split()[1:] == [
        "mig-1g5gb-6", "1g.5gb", "default/inference-0", "inference", "exclusive", "ok"
    ]  # fmt: skip
    assert lines.index(_row(lines, "└ mig-3g20gb-0")) == lines.index(_row(lines, GPU0)) + 1


def test_an_unhealthy_gpu_shows_its_fault_and_a_line_with_its_message() -> None:
    lines = render(_document()).splitlines()
    assert _row(lines, GPU1).endswith("XID 62")
    assert f"unhealthy: {GPU1}: XID 62 on GPU GPU-1" in lines


def test_lost_gpus_are_listed_with_what_they_held_and_why_they_are_lost() -> None:
    lines = render(_document()).splitlines()
    lost = _row(lines, GPU2)
    assert lost.split()[1:] == ["lost,", "XID", "79"]
    assert lines[lines.index(lost) + 1].split()[1:4] == ["whole", "GPU", "default/trainer-0"]
    assert _row(lines, "(GPU index 3)").split()[-1] == "lost"
    assert f"lost: {GPU2}: GPU is lost" in lines and "lost: (GPU index 3): GPU is lost" in lines
    assert "node node-a: 2 allocated, 2 lost, 1 unhealthy" in lines


def test_an_informational_fault_keeps_the_gpu_ok_and_an_unwatched_one_is_unknown() -> None:
    document = _document()
    document["gpus"][1]["health"] = {"status": "HEALTHY", "message": "", "taints": [_taint("xid", "31", "None")]}
    document["gpus"][0]["health"] = {"status": "UNKNOWN", "message": "health is not watched", "taints": []}
    lines = render(document).splitlines()
    assert _row(lines, GPU1).endswith("ok (XID 31)")
    assert _row(lines, GPU0).endswith("unknown")
    assert f"unknown: {GPU0}: health is not watched" in lines


def test_a_document_of_a_driver_without_health_or_mig_devices_still_renders() -> None:
    """What drivers before the health and MIG fields answered: the GPUs and the allocations only."""
    document = {
        "node": "node-a",
        "gpus": [{"name": GPU0, "uuid": "GPU-0", "productName": "NVIDIA L4", "index": 0}],
        "allocations": [],
        "usage": [],
    }
    lines = render(document).splitlines()
    assert _row(lines, GPU0).split()[1:] == ["NVIDIA", "L4"]
    assert "└ free" in lines[2] and lines[-1] == "node node-a: 0 allocated"


def test_devices_of_a_driver_whose_slices_are_not_published_are_not_free() -> None:
    """No pod can be given a device the API server does not list: top says "not published", with the error."""
    document = {**_document(), "ready": False, "slicesPublished": False, "publishError": "503: leader changed"}
    lines = render(document).splitlines()
    assert _row(lines, "└ mig-3g20gb-0").split()[1:4] == ["mig-3g20gb-0", "3g.20gb", "not"]
    assert "not published" in _row(lines, "└ mig-3g20gb-0") and not any(" free" in line for line in lines)
    assert "not published: no pod can be given these devices until the ResourceSlices are: 503: leader changed" in lines
    document = {"node": "node-a", "slicesPublished": False, "gpus": [{"name": GPU0}], "allocations": []}
    lines = render(document).splitlines()
    assert lines[2].split() == ["└", "not", "published"]
    assert lines[-1].endswith("until the ResourceSlices are: the driver has not published them yet")


def test_a_starting_driver_says_what_it_waits_for() -> None:
    document = {"node": "node-a", "waitingFor": "the NVIDIA driver", "gpus": [], "allocations": [], "usage": []}
    assert render(document).splitlines()[-1] == "node node-a: 0 allocated (the driver is starting: the NVIDIA driver)"


@pytest.mark.parametrize(
    ("address", "url"),
    [
        ("127.0.0.1:8080", "http://127.0.0.1:8080/allocations"),
        (":8080", "http://127.0.0.1:8080/allocations"),
        ("0.0.0.0:8080", "http://127.0.0.1:8080/allocations"),
        ("driver.example:9400", "http://driver.example:9400/allocations"),
        ("http://localhost:8080", "http://localhost:8080/allocations"),
        ("http://localhost:8080/", "http://localhost:8080/allocations"),
        ("HTTP://localhost:8080/allocations", "http://localhost:8080/allocations"),
        ("[::1]:8080", "http://[::1]:8080/allocations"),
        ("http://[::1]:8080/", "http://[::1]:8080/allocations"),
        ("[::]:8080", "http://[::1]:8080/allocations"),
    ],
)
def test_address_as_host_and_port_or_as_a_url(address: str, url: str) -> None:
    assert allocations_url(address) == url


@pytest.mark.parametrize(
    "address",
    [
        "localhost",
        "http://localhost",
        "localhost:0",
        "http://localhost:8080/metrics",
        "http://localhost:8080/?x=1",
        "http://user@localhost:8080",
        "ftp://localhost:8080",
        "[::1:8080",
        "[zz::1]:8080",
        "local host:8080",
        "localhost/x:8080",
    ],
)
def test_any_other_address_is_one_line_and_exit_2(address: str, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["top", "--address", address, "--once"]) == 2
    (line,) = capsys.readouterr().err.splitlines()
    assert line == (
        f"dradriver top: error: --address {address!r} is not HOST:PORT, :PORT or http://HOST:PORT (a port from 1 "
        "to 65535; an IPv6 host in brackets, e.g. [::1]:8080)"
    )


@pytest.mark.parametrize("address", ["fe80::1:8080", "::1:8080", "http://fe80::1:8080/"])
def test_an_ipv6_address_without_brackets_is_refused_with_the_bracketed_form(
    address: str, capsys: pytest.CaptureFixture[str]
) -> None:
    """fe80::1:8080 is also the address fe80::1:8080 with no port: top does not guess."""
    assert main(["top", "--address", address, "--once"]) == 2
    (line,) = capsys.readouterr().err.splitlines()
    host = address.removeprefix("http://").removesuffix("/").rpartition(":")[0]
    assert line == (
        f"dradriver top: error: --address {address!r}: an IPv6 host goes in brackets, so that its port is not read "
        f"as part of it: write [{host}]:8080"
    )


def test_https_is_refused_the_status_server_speaks_plain_http(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["top", "--address", "https://localhost:8080", "--once"]) == 2
    (line,) = capsys.readouterr().err.splitlines()
    assert "speaks plain HTTP, not HTTPS; give http://HOST:PORT or HOST:PORT" in line
