"""``dradriver convert``: a cluster's NVIDIA device plugin config and GPU workloads, printed as DRA objects for our
driver (the translation is cli/convert_plan.py; docs/migrating-from-device-plugin.md)."""

from __future__ import annotations

import argparse
import textwrap
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from dradriver.cli.convert_plan import (
    POD_SPEC_PATHS,
    ConvertError,
    Plan,
    PluginConfig,
    Workload,
    configs_in_config_map,
    is_plugin_config,
    plan,
    read_plugin_config,
)
from dradriver.cli.explain_input import STDIN, chart_classes, yaml_files
from dradriver.inputs import InputError, load_yaml_file, parse_yaml, path_exists, read_stdin, type_name

WRAP = 116


def register(parser: argparse.ArgumentParser) -> None:
    """The options of this command on ``parser`` (cli/main.py adds it to the command line)."""
    parser.description = (
        "Read NVIDIA's device plugin config (its file or ConfigMap) and workloads that ask for nvidia.com/gpu or "
        "nvidia.com/mig-<profile> in their limits; print the DRA objects that do the same with dradriver: "
        "DeviceClasses the chart lacks, ResourceClaimTemplates (or shared ResourceClaims) with GpuConfig sharing, "
        "and the workloads rewritten to use them. Comments say what differs."
    )
    parser.add_argument(
        "paths", nargs="+", metavar="FILE|DIR|-", help="YAML files, directories of them, or - for stdin"
    )
    parser.add_argument(
        "--keep-limits",
        action="store_true",
        help="leave the workloads as written: print only the DeviceClasses the cluster needs for their limits",
    )
    parser.add_argument(
        "--config",
        metavar="NAME",
        help="which config of the device plugin's ConfigMap to convert (its data key), when it holds several",
    )
    parser.set_defaults(handler=run)


def run(args: argparse.Namespace) -> int:
    found = Found()
    for path in args.paths:
        _read(path, found)
    config = _chosen_config(found, args.config)
    result = plan(found.workloads, config, keep_limits=args.keep_limits, chart_classes=chart_classes())
    result.notes[:0] = found.notes
    print(render(result), end="")
    return 0


@dataclass
class Found:
    """What the inputs hold: device plugin configs (data key or None, the config, its source) and workloads."""

    configs: list[tuple[str | None, dict[str, Any], str]] = field(default_factory=list)
    workloads: list[Workload] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)


def _read(raw_path: str, found: Found) -> None:
    if raw_path == STDIN:
        for number, doc in enumerate(parse_yaml(read_stdin(), source="standard input"), start=1):
            _add(doc, f"standard input #{number}", found)
        return
    path = Path(raw_path)
    if not path_exists(path):
        raise InputError(f"{raw_path}: no such file or directory; pass a YAML file, a directory or -")
    for file in yaml_files(path):
        for number, doc in enumerate(load_yaml_file(file), start=1):
            _add(doc, f"{file} #{number}", found)


def _add(doc: Any, source: str, found: Found) -> None:
    if doc is None:
        return
    if not isinstance(doc, dict):
        raise InputError(f"{source}: not a Kubernetes object or device plugin config: got {type_name(doc)}")
    kind = doc.get("kind")
    if is_plugin_config(doc):
        found.configs.append((None, doc, source))
    elif kind == "ConfigMap":
        configs = configs_in_config_map(doc, source)
        found.configs += [(key, config, f"{source} data.{key}") for key, config in configs.items()]
        if not configs:
            found.notes.append(f"{source}: ConfigMap holds no device plugin config: left out.")
    elif isinstance(kind, str) and kind.endswith("List") and isinstance(doc.get("items"), list):
        for i, item in enumerate(doc["items"]):
            _add(item, f"{source} items[{i}]", found)
    elif kind in POD_SPEC_PATHS:
        found.workloads.append(Workload(doc, source))
    else:
        found.notes.append(f"{source}: {kind} is not a workload or a device plugin config: left out.")


def _chosen_config(found: Found, name: str | None) -> PluginConfig:
    configs = found.configs
    if name is not None:
        configs = [c for c in configs if c[0] == name]
        if not configs:
            known = ", ".join(sorted({str(c[0]) for c in found.configs if c[0]})) or "none"
            raise ConvertError(
                f"--config {name}: no ConfigMap holds a device plugin config of that name (known: {known})"
            )
    if len(configs) > 1:
        names = ", ".join(str(key) if key else source for key, _c, source in configs)
        raise ConvertError(f"several device plugin configs ({names}); pick one with --config NAME")
    if not configs:
        found.notes.append("No device plugin config given: nothing shared, flags.migStrategy none.")
        return PluginConfig(source="none")
    _key, data, source = configs[0]
    found.notes.append(f"Device plugin config: {source}.")
    return read_plugin_config(data, source)


def render(result: Plan) -> str:
    """The plan as a YAML stream: the notes as comments on top, each object after its comments."""
    text = _comments(["dradriver convert: NVIDIA device plugin config and workloads as DRA objects", *result.notes])
    for converted in result.objects():
        text += "---\n" + _comments(converted.comments)
        text += yaml.safe_dump(converted.obj, sort_keys=False, default_flow_style=False)
    return text


def _comments(lines: list[str]) -> str:
    wrapped = [
        part for line in lines for part in textwrap.wrap(line, WRAP, subsequent_indent="  ", break_on_hyphens=False)
    ]
    return "".join(f"# {line}\n" for line in wrapped)
