"""Run deploy/Dockerfile's build and install steps outside Docker (CI has no Docker engine,
and the base image's registry is out of its reach).

    python deploy/dockerfile_steps.py WORK_DIR      # with the Python of a fresh venv

Each stage gets a directory under WORK_DIR standing for its file system: ``COPY`` copies
from the checkout (only what the Dockerfile names, so a file the build needs and the
Dockerfile forgets fails here too), ``COPY --from=STAGE`` from that stage's directory, and
each ``RUN`` runs in bash, its ``&&`` steps one by one, with the stage's absolute paths
mapped into its directory and ``pip``/``python`` being this interpreter's. Steps that change
the system rather than the image's Python are skipped and said so: ``apt-get`` (the machine's
own C compiler builds the core) and ``useradd``. The last stage's interpreter is this one:
run it in a fresh venv, which then holds what the image would (the compiled core checked by
the Dockerfile's own step). Exit status: the first failing step's, or 0.
"""

from __future__ import annotations

import re
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
DOCKERFILE = ROOT / "deploy" / "Dockerfile"
SKIPPED = ("apt-get ", "rm -rf /var/lib/apt/lists", "useradd ")


def instructions(text: str) -> list[tuple[str, str]]:
    """(INSTRUCTION, arguments) in order, continuation lines joined, comments left out."""
    found, pending = [], ""
    for line in text.splitlines():
        if not pending and (not line.strip() or line.lstrip().startswith("#")):
            continue
        pending += line.rstrip()
        if pending.endswith("\\"):
            pending = pending[:-1] + " "
            continue
        word, _, rest = pending.strip().partition(" ")
        found.append((word.upper(), " ".join(rest.split())))
        pending = ""
    return found


class Stage:
    def __init__(self, name: str, root: Path) -> None:
        self.name, self.root, self.workdir = name, root, "/"
        root.mkdir(parents=True, exist_ok=True)

    def path(self, inside: str) -> Path:
        """Where an absolute (or workdir-relative) path of the stage lives here."""
        joined = inside if inside.startswith("/") else f"{self.workdir.rstrip('/')}/{inside}"
        return self.root / joined.lstrip("/")

    def shell(self, command: str) -> str:
        """``command`` with the stage's absolute paths and its pip and python mapped."""
        python = shlex.quote(sys.executable)
        command = re.sub(r"(?<![\w./-])/(?=[a-z])", f"{self.root}/", command)
        command = re.sub(r"(?<![\w./-])pip (?=\w)", f"{python} -m pip ", command)
        return re.sub(r"(?<![\w./-])python (?=-)", f"{python} ", command)


def copy(source: Path, target: Path) -> None:
    if source.is_dir():
        shutil.copytree(source, target, dirs_exist_ok=True,
                        ignore=shutil.ignore_patterns("__pycache__", "*.so", "build"))
    else:
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(source, target)


def run(work: Path) -> int:
    stages: dict[str, Stage] = {}
    stage: Stage | None = None
    for word, args in instructions(DOCKERFILE.read_text()):
        if word == "FROM":
            name = args.split(" AS ")[-1] if " AS " in args else f"stage{len(stages)}"
            stage = stages[name] = Stage(name, work / name)
            print(f"--- stage {name} ({args.split()[0]}): {stage.root}", flush=True)
            continue
        assert stage is not None, f"{word} before FROM"
        if word == "WORKDIR":
            stage.workdir = args
            stage.path(args).mkdir(parents=True, exist_ok=True)
        elif word == "COPY":
            parts = args.split()
            origin = None
            if parts[0].startswith("--from="):
                origin = stages[parts.pop(0).removeprefix("--from=")]
            *sources, target = parts
            for source in sources:
                src = origin.path(source) if origin else ROOT / source
                dest = stage.path(target)
                copy(src, dest / src.name if target.endswith("/") or len(sources) > 1
                     else dest)
            print(f"COPY {args}", flush=True)
        elif word == "RUN":
            for step in args.split(" && "):
                if step.startswith(SKIPPED):
                    print(f"skipped (a system step): {step}", flush=True)
                    continue
                command = stage.shell(step)
                print(f"RUN {step}", flush=True)
                done = subprocess.run(["bash", "-c", command], cwd=stage.path("."),
                                      check=False)
                if done.returncode != 0:
                    print(f"failed ({done.returncode}): {step}", file=sys.stderr)
                    return done.returncode
    return 0


def main(argv: list[str]) -> int:
    if len(argv) != 1:
        print(__doc__, file=sys.stderr)
        return 2
    work = Path(argv[0]).resolve()
    shutil.rmtree(work, ignore_errors=True)
    return run(work)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
