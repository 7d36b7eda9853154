"""The manifests of a page in docs/recipes/, as the recipe tests apply them: every ```yaml block that opens with a
``# file: NAME.yaml`` line is a file the reader saves and applies, so the tests apply that block's text as written."""

from __future__ import annotations

import os
import re
import shlex
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from support.cluster_pods import kubectl

REPO = Path(__file__).resolve().parents[2]
RECIPES = REPO / "docs" / "recipes"
_BLOCK = re.compile(r"^```yaml\n(# file: (\S+)\n.*?)^```", re.DOTALL | re.MULTILINE)


def page_files(page: str) -> dict[str, str]:
    """File name -> the text of its ```yaml block in docs/recipes/``page``; a name given twice is an error."""
    files: dict[str, str] = {}
    for match in _BLOCK.finditer((RECIPES / page).read_text()):
        text, name = match.group(1), match.group(2)
        if name in files:
            raise AssertionError(f"docs/recipes/{page}: two blocks are called {name}")
        files[name] = text
    return files


def documents(text: str) -> list[dict[str, Any]]:
    """The objects of one file's text."""
    return [doc for doc in yaml.safe_load_all(text) if doc]


@dataclass(frozen=True)
class Step:
    """One ``$ command`` of a page's console block and the output the page shows for it."""

    command: str
    output: str


def transcript(page: str, section: str) -> list[Step]:
    """The ``$`` commands of the plain ``` blocks under the heading ``section`` (up to the next heading of its level
    or above), in order, with the lines the page shows after each."""
    steps: list[Step] = []
    language: str | None = None  # of the fenced block we are in; None outside one
    for line in _section(page, section).splitlines():
        if line.startswith("```"):
            language = line[3:] if language is None else None
        elif language == "" and line.startswith("$ "):
            steps.append(Step(line[2:], ""))
        elif language == "" and steps:
            steps[-1] = Step(steps[-1].command, f"{steps[-1].output}\n{line}".lstrip("\n"))
    return steps


def _section(page: str, heading: str) -> str:
    """The lines under ``heading`` up to the next heading of its level or above (headings in code blocks aside)."""
    level = len(heading.split(" ", 1)[0])
    lines: list[str] = []
    inside = fenced = False
    for line in (RECIPES / page).read_text().splitlines():
        if line.startswith("```"):
            fenced = not fenced
        is_heading = not fenced and re.match(rf"#{{1,{level}}} ", line) is not None
        if inside and is_heading:
            break
        inside = inside or (line == heading and not fenced)
        if inside:
            lines.append(line)
    if not lines:
        raise AssertionError(f"docs/recipes/{page} has no heading {heading!r}")
    return "\n".join(lines) + "\n"


@dataclass
class Console:
    """Runs a section's commands as a reader would, in a directory holding the page's files, with ``KUBECONFIG``
    set: ``kubectl`` (the test extras'), ``dradriver`` (this checkout's) and ``echo $?``. Each step's output must be
    the page's, after ``normalize`` (names with random suffixes): :meth:`check` lists every step that differed. A
    read-only step (``get``, ``describe``, ``logs``, ``explain``) is asked again until it matches or ``timeout`` runs
    out, since what it reads settles asynchronously."""

    directory: Path
    kubeconfig: Path
    steps: list[Step]
    normalize: Callable[[str], str] = lambda text: text
    timeout: float = 90.0
    last_code: int = field(default=0, init=False)
    outputs: list[str] = field(default_factory=list, init=False)
    differences: list[str] = field(default_factory=list, init=False)

    def next(self, command: str, *, or_else: Callable[[str], bool] | None = None) -> str:
        """Run the section's next step, which must be ``command``; its output. ``or_else``: the other outcome the
        page's prose describes for this step (a race it names), judged on the output and the cluster."""
        step = self.steps[len(self.outputs)]
        assert step.command == command, f"the page's next command is {step.command!r}, the test runs {command!r}"
        output = str(self.last_code) if command == "echo $?" else self._settled(step)
        described = or_else is not None and or_else(output)
        if self.normalize(output) != self.normalize(step.output) and not described:
            self.differences.append(f"$ {command}\nthe page shows:\n{step.output}\nit printed:\n{output}\n")
        self.outputs.append(output)
        return output

    def check(self) -> None:
        """Every step printed what the page shows, and the page shows no step the test did not run."""
        left = [step.command for step in self.steps[len(self.outputs) :]]
        assert not self.differences and not left, "\n".join([*self.differences, *(f"not run: {c}" for c in left)])

    def _settled(self, step: Step) -> str:
        words = step.command.split()
        read_only = bool({"get", "describe", "logs"} & set(words)) or words[:2] == ["dradriver", "explain"]
        deadline = time.monotonic() + (self.timeout if read_only else 0)
        while True:
            self.last_code, output = self.run(step.command)
            if self.normalize(output) == self.normalize(step.output) or time.monotonic() >= deadline:
                return output
            time.sleep(1)

    def run(self, command: str) -> tuple[int, str]:
        """Run ``command`` as the page would (no check of its output): its exit status and output."""
        argv = shlex.split(command)
        programs = {"kubectl": [kubectl()], "dradriver": [sys.executable, "-m", "dradriver"]}
        if argv[0] not in programs:
            raise AssertionError(f"the page runs {argv[0]!r}: only kubectl and dradriver are run here")
        env = {**os.environ, "KUBECONFIG": str(self.kubeconfig)}
        done = subprocess.run([*programs[argv[0]], *argv[1:]], cwd=self.directory, env=env, capture_output=True,
                              text=True, timeout=120, check=False)  # fmt: skip
        return done.returncode, (done.stdout + done.stderr).rstrip("\n")

    def write_files(self, page: str, rewrite: Callable[[str], str] | None = None) -> None:
        """The page's files, as a reader saves them; ``rewrite`` changes each file's text first (the node tests pin
        pods to their node)."""
        for name, text in page_files(page).items():
            (self.directory / name).write_text(rewrite(text) if rewrite else text)
