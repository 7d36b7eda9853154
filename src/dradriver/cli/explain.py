"""``dradriver explain``: will my claim fit, and why not? (offline, with the scheduler's semantics)

    dradriver explain CLAIM.yaml [--classes FILE|DIR] [--slices FILE|DIR | --sim-profile NAME] [-o json]
    dradriver explain --selector 'EXPR' [--slices …]
    dradriver explain --pod NS/NAME [--kubeconfig …] [--context …]

Exit status: 0 when every claim fits (or the selector matches a device), 1 when one does not, 2 on
invalid input (each bad document is reported; the others are still explained). Objects that are not DRA
objects explain reads (the Pod or Deployment beside a claim) are skipped with a note.
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from typing import Any

from dradriver.cel import CelCompileError, CelEvaluationError, compile_selector
from dradriver.cli.explain_input import (
    Document,
    Inputs,
    chart_classes,
    check_claim,
    check_class,
    load,
    passthrough_classes,
)
from dradriver.cli.explain_node import NodeSettings
from dradriver.cli.explain_outcome import (
    EXIT_DOES_NOT_FIT,
    EXIT_FITS,
    EXIT_INVALID,
    ClaimOutcome,
    explain_document,
    outcome_dict,
    render_outcome,
)
from dradriver.cli.flags import kube_client
from dradriver.cli.flags.fabric_manager import FABRIC_MANAGER_PARTITIONS
from dradriver.cli.flags.gpus import MIG_MODE
from dradriver.cli.flags.output import add_output_option
from dradriver.cli.flags.passthrough import PASSTHROUGH
from dradriver.cli.flags.publishing import COMPAT, KUBERNETES_VERSION, driver_name_of
from dradriver.cli.flags.sharing import CONSUMABLE_SHARES, GPU_SHARING, SharingOptions
from dradriver.errors import ConfigError
from dradriver.validation import MAX_CEL_LENGTH

MAX_DEVICES_SHOWN = 6


def register(parser: argparse.ArgumentParser) -> None:
    """The options of this command on ``parser`` (cli/main.py adds it to the command line)."""
    parser.description = (
        "Allocate ResourceClaims / ResourceClaimTemplates offline as the scheduler would and "
        "explain the result per request: which devices matched every selector, what rejected "
        "the others, and what would make the claim fit."
    )
    _add_claim_options(parser)
    _add_device_options(parser)
    parser.add_argument("--node", help="explain for this node only (default: every node of the slices)")
    _add_selector_options(parser)
    _add_pod_options(parser)
    add_output_option(parser, ("text", "json"), "text")
    parser.set_defaults(handler=run)


def _add_claim_options(parser: argparse.ArgumentParser) -> None:
    """What to explain: the claim files, and the DeviceClasses they name."""
    parser.add_argument(
        "claims",
        nargs="*",
        metavar="CLAIM.yaml",
        help="files or directories with ResourceClaims / ResourceClaimTemplates (they may also "
        "hold DeviceClasses and ResourceSlices)",
    )
    parser.add_argument(
        "--classes",
        action="append",
        default=[],
        metavar="FILE|DIR",
        help="DeviceClasses (default: those the Helm chart installs, NVIDIA's names with --compat nvidia)",
    )


def _add_device_options(parser: argparse.ArgumentParser) -> None:
    """What to allocate from: ResourceSlices from files or from a simulated node (its MIG mode, the names of a
    --compat preset), and the devices other claims already hold."""
    source = parser.add_mutually_exclusive_group()
    source.add_argument(
        "--slices", action="append", default=[], metavar="FILE|DIR", help="ResourceSlices to allocate from"
    )
    source.add_argument("--sim-profile", metavar="NAME", help="build ResourceSlices from a simulated node")
    node = parser.add_argument_group(
        "the simulated node's settings (with --sim-profile; the defaults are the Helm chart's)"
    )
    MIG_MODE.add(node, help="how MIG is published (chart value gpu.migMode)")
    GPU_SHARING.add(node, help="whole GPUs for one claim each, or as consumable capacity (chart value gpu.sharing)")
    CONSUMABLE_SHARES.add(node, help="NVIDIA's consumable shares (chart value gpu.consumableShares)")
    FABRIC_MANAGER_PARTITIONS.add(
        node,
        help="Fabric Manager's NVSwitch partitions on whole GPUs (gpuModuleID, partition<size>) of an NVSwitch profile "
        "(chart value fabricManagerPartitions.enabled)",
    )
    PASSTHROUGH.add(
        node,
        help="also offer every GPU as a VFIO passthrough device (<gpu>-vfio, type vfio, consuming its GPU's counters; "
        "DeviceClass vfio.gpu.dradriver.dev) as run --passthrough true does (chart value passthrough.enabled)",
    )
    KUBERNETES_VERSION.add(
        node,
        help="the cluster's Kubernetes minor version: the ResourceSlice rules --slices are checked by (up to 1.34 a "
        "MIG device's counter sets may sit in its own slice) and the shape --sim-profile builds",
    )
    parser.add_argument(
        "--allocated",
        action="append",
        default=[],
        metavar="FILE|DIR",
        help="ResourceClaims whose status.allocation already holds devices",
    )
    COMPAT.add(
        parser,
        help="with --sim-profile, and for the default DeviceClasses and config checks: the names of the "
        "driver's --compat preset ('nvidia': gpu.nvidia.com, DeviceClasses gpu.nvidia.com and mig.nvidia.com)",
    )


def _add_selector_options(parser: argparse.ArgumentParser) -> None:
    """--selector: one CEL expression tested against every device instead of a claim."""
    parser.add_argument("--selector", metavar="EXPR", help="test one CEL selector against every device")
    parser.add_argument(
        "--driver",
        help="with --selector and no slices: the driver name devices belong to (default: gpu.dradriver.dev, "
        "gpu.nvidia.com with --compat nvidia)",
    )


def _add_pod_options(parser: argparse.ArgumentParser) -> None:
    """--pod: the claims of a pending pod, read from the cluster."""
    parser.add_argument("--pod", metavar="NS/NAME", help="read a pod's claims from the cluster: why is it Pending?")
    kube_client.add_flags(parser, kubeconfig_help="with --pod: kubeconfig file", context=True, rate_limits=False)


def _driver_name(args: argparse.Namespace) -> str:
    return driver_name_of(args)


def _builtin_classes(args: argparse.Namespace) -> list[dict[str, Any]]:
    """The DeviceClasses the driver's install brings: the chart's, with its --compat preset's names, and the one
    ``passthrough.enabled`` adds (a claim of it fits only with --passthrough, which explain then names)."""
    return chart_classes(args.compat) + passthrough_classes(args.compat)


def _builtin_class_names(args: argparse.Namespace) -> str:
    """The assumed classes in one line, every name there: the per-profile MIG classes folded into one pattern."""
    names = [str(c["metadata"]["name"]) for c in chart_classes(args.compat)]
    domains = [n for n in names if n.startswith("compute-domain-")]
    profiles = [m for m in (re.fullmatch(r"mig-(\d+g\.\d+gb)\.(.+)", n) for n in names) if m]
    plain = [n for n in names if n not in domains and not re.fullmatch(r"mig-\d+g\.\d+gb\..+", n)]
    if profiles:
        folded = ",".join(m.group(1) for m in profiles)
        plain.append(f"mig-{{{folded}}}.{profiles[0].group(2)} (one per MIG profile)")
    preset = " with compat=nvidia" if args.compat == "nvidia" else ""
    vfio = ", ".join(str(c["metadata"]["name"]) for c in passthrough_classes(args.compat))
    return (
        f"the DeviceClasses the chart installs{preset}: {', '.join(plain)}, and with computeDomains.enabled "
        f"{', '.join(domains)}; with passthrough.enabled {vfio}; --classes FILE|DIR to use your cluster's"
    )


def run(args: argparse.Namespace) -> int:
    if args.pod:
        from dradriver.cli.explain_cluster import explain_pod

        return explain_pod(args)
    settings = _node_settings(args)
    inputs, allocated_inputs = _load_inputs(args, settings)
    slices = [d.obj for d in inputs.of_kind("ResourceSlice")]
    if args.sim_profile:
        slices += settings.slices(args.sim_profile, _driver_name(args))
    if args.selector is not None:
        return explain_selector(args, slices, inputs)
    if not args.claims:
        raise ConfigError("give CLAIM.yaml files, --selector EXPR or --pod NS/NAME")
    if not slices:
        if inputs.errors:  # the slices given could not be read: say why rather than that there are none
            render([], inputs, args.output, assumptions=[])
            return EXIT_INVALID
        raise ConfigError("no ResourceSlices to allocate from: pass --slices FILE|DIR or --sim-profile NAME")
    class_docs = inputs.of_kind("DeviceClass")
    if args.classes and not class_docs and not inputs.errors:
        raise ConfigError("no DeviceClass found in " + ", ".join(args.classes))
    # The chart's classes stand in only when no --classes was given at all.
    classes = [d.obj for d in class_docs] or ([] if args.classes else _builtin_classes(args))
    for doc in class_docs:
        inputs.errors += check_class(doc)
    class_names = {str((c.get("metadata") or {}).get("name")) for c in classes}
    allocated = [d.obj for d in allocated_inputs.documents]
    outcomes = []
    for doc in inputs.of_kind("ResourceClaim", "ResourceClaimTemplate"):
        problems = check_claim(doc, class_names, driver_name=_driver_name(args))
        if problems:
            inputs.errors += problems
            continue
        outcome = explain_document(doc, slices=slices, classes=classes, allocated=allocated, node=args.node)
        if args.sim_profile and not outcome.fits:
            outcome.would_fit_with = _would_fit_with(args, settings, doc, classes, allocated)
        outcomes.append(outcome)
    render(outcomes, inputs, args.output, assumptions=_assumptions(args, settings, used_builtin=not args.classes))
    if inputs.errors:
        return EXIT_INVALID
    if not outcomes:
        raise ConfigError("no ResourceClaim or ResourceClaimTemplate found in " + ", ".join(args.claims))
    return EXIT_FITS if all(o.fits for o in outcomes) else EXIT_DOES_NOT_FIT


def _node_settings(args: argparse.Namespace) -> NodeSettings:
    """The simulated node's settings, refused as ``run`` refuses them (a share count the slices cannot carry, a
    setting the release does not have)."""
    settings = NodeSettings.from_args(args)
    SharingOptions(gpu_sharing=settings.gpu_sharing, consumable_shares=settings.consumable_shares).check()
    problem = settings.release_problem() if args.sim_profile else None
    if problem:
        raise ConfigError(problem)
    return settings


def _load_inputs(args: argparse.Namespace, settings: NodeSettings) -> tuple[Inputs, Inputs]:
    """The claims, classes and slices given (slices checked by the rules of --kubernetes-version), and the claims
    already allocated."""
    from dradriver.driver.publish.slices import shape_for

    inputs = Inputs(slice_shape=shape_for(settings.kubernetes_version), compute_domains=settings.compute_domains)
    load(args.claims, inputs)
    if args.classes:
        load(args.classes, inputs, want=("DeviceClass",))
    if args.slices:
        load(args.slices, inputs, want=("ResourceSlice",))
    allocated_inputs = Inputs()
    if args.allocated:
        load(args.allocated, allocated_inputs, want=("ResourceClaim",))
    inputs.errors += allocated_inputs.errors
    inputs.skipped += allocated_inputs.skipped
    return inputs, allocated_inputs


def _would_fit_with(
    args: argparse.Namespace,
    settings: NodeSettings,
    doc: Document,
    classes: list[dict[str, Any]],
    allocated: list[dict[str, Any]],
) -> list[str]:
    """The other settings of the simulated node, one change at a time, under which the claim would fit."""
    found = []
    for other, how in settings.alternatives():
        slices = other.slices(args.sim_profile, _driver_name(args))
        if explain_document(doc, slices=slices, classes=classes, allocated=allocated, node=args.node).fits:
            found.append(how)
    return found


def _assumptions(args: argparse.Namespace, settings: NodeSettings, *, used_builtin: bool) -> list[str]:
    """What explain assumed that the input did not say: the DeviceClasses, the simulated node's settings."""
    lines = [f"no --classes given: using {_builtin_class_names(args)}"] if used_builtin else []
    if args.sim_profile:
        lines.append(f"simulated node {args.sim_profile} as the chart's defaults unless set: {settings.describe()}")
    return lines


def print_problems(inputs: Inputs) -> None:
    for note in inputs.skipped:
        print(f"note: {note}", file=sys.stderr)
    for error in inputs.errors:
        print(f"error: {error}", file=sys.stderr)


def render(outcomes: list[ClaimOutcome], inputs: Inputs, output: str, *, assumptions: list[str]) -> None:
    """Print the outcomes, after what was assumed (each assumption a line in parentheses; ``assumptions`` in JSON)."""
    if output == "json":
        claims = [outcome_dict(o) for o in outcomes]
        document = {"errors": inputs.errors, "skipped": inputs.skipped, "assumptions": assumptions, "claims": claims}
        json.dump(document, sys.stdout, indent=2)
        sys.stdout.write("\n")
        return
    print_problems(inputs)
    if outcomes:
        for line in assumptions:
            print(f"({line})")
    for outcome in outcomes:
        print(render_outcome(outcome))


def explain_selector(args: argparse.Namespace, slices: list[dict[str, Any]], inputs: Inputs) -> int:
    """Evaluate one selector against every device; exit 0 when at least one device matches."""
    print_problems(inputs)
    if len(args.selector) > MAX_CEL_LENGTH:
        raise ConfigError(
            f"--selector: {len(args.selector)} characters; the API server accepts at most {MAX_CEL_LENGTH}"
        )
    try:
        selector = compile_selector(args.selector)
    except CelCompileError as err:
        raise ConfigError(f"--selector: invalid CEL at {err}") from err
    if not slices:
        raise ConfigError("no devices to test the selector on: pass --slices FILE|DIR or --sim-profile NAME")
    rows = []
    for slice_ in slices:
        spec = slice_.get("spec") or {}
        if args.node and spec.get("nodeName") != args.node:
            continue
        driver = str(spec.get("driver", args.driver or _driver_name(args)))
        for device in spec.get("devices") or []:
            try:
                verdict = "match" if selector.matches(device, driver=driver) else "no match"
            except CelEvaluationError as err:
                verdict = f"error: {err}"
            rows.append({"node": spec.get("nodeName"), "device": device.get("name"), "result": verdict})
    matched = sum(1 for r in rows if r["result"] == "match")
    failed = sum(1 for r in rows if r["result"].startswith("error"))
    if args.output == "json":
        json.dump(
            {"expression": args.selector, "matched": matched, "errors": failed, "devices": rows},
            sys.stdout,
            indent=2,
        )
        sys.stdout.write("\n")
    else:
        # Devices of a node mostly behave alike: one line per (node, outcome), naming a few of its devices.
        groups: dict[tuple[str, str], list[str]] = {}
        for row in rows:
            groups.setdefault((row["node"] or "-", row["result"]), []).append(str(row["device"]))
        for (node, result), names in groups.items():
            shown = ", ".join(names[:MAX_DEVICES_SHOWN]) + (
                f", … ({len(names)} in all)" if len(names) > MAX_DEVICES_SHOWN else ""
            )
            print(f"{node}  {result}: {shown}")
        print(f"{matched} of {len(rows)} devices match; {failed} failed with an error")
    if inputs.errors:
        return EXIT_INVALID
    return EXIT_FITS if matched else EXIT_DOES_NOT_FIT
