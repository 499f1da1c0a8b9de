"""Every command and Python block of README.md runs as a user runs it from a fresh clone.

The README's fenced ``bash`` blocks are read line by line (comments skipped, ``\\`` continuations
joined) and each line runs through ``bash`` in a fresh temporary folder holding a copy of the
repository's ``examples/``, so relative paths behave as at the root of a new clone; ``emgrid``,
``.venv/bin/emgrid``, ``python`` and ``.venv/bin/python`` are the installed package of the
interpreter running these tests. A command must exit 0, or the code a trailing comment states
(``emgrid fit ... --max-iter 2   # exits 1``). The first block's set-up (creating the venv, the
pip install, the test command) is not run again: it is what ``.ci/run`` runs, and a test holds
the two to the same text.

The ``python`` blocks of one README section run in order in one interpreter, one namespace and
one fresh folder, so a block may use the names of the blocks before it in its section; each
block is its own test case.

Every block is a test case named by the line of its opening fence (``L86-bash-the-command``).
A block that cannot run here (an external cluster, a launcher that is not installed, an
illustration such as a ``--resume`` after a kill) carries an HTML comment on the line just
before its fence, which the rendered README does not show::

    <!-- readme-test: skip (needs a running Ray cluster) -->
    <!-- readme-test: slow (fits digits: about 2 minutes) -->

and is reported as skipped with that reason; ``slow`` blocks run when ``EMGRID_README_SLOW=1``.
A command or block that fails because of a known bug in the product is listed in
``KNOWN_BUGS`` below: it is expected to fail, and its test turns red once it passes.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import subprocess
import sys
import textwrap
from dataclasses import dataclass, field
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
README = ROOT / "README.md"
CI_SCRIPT = ROOT / ".ci" / "run"

COMMAND_TIMEOUT_S = 240
SECTION_TIMEOUT_S = 300
OUTPUT_TAIL_LINES = 40

SHELL_LANGS = {"bash", "sh", "shell"}
PYTHON_LANGS = {"python", "py"}
MARKER_KINDS = {"skip", "slow"}

# A command's text as the README writes it (or a Python block's first line of code) -> why it
# fails today. Such a command is still run: its block is xfail while it fails as expected and
# fails once it passes, so the entry goes when the bug is fixed.
KNOWN_BUGS: dict[str, str] = {}

# The first shell block's parts that set up the environment: CI runs them itself.
SETUP = re.compile(r"(-m venv|\bpip install|-m pytest)\b")
MARKER = re.compile(r"^\s*<!--\s*readme-test:\s*(?P<kind>[\w-]+)\s*(?:\((?P<reason>.*)\))?\s*-->\s*$")
MARKER_LIKE = re.compile(r"readme-test")
FENCE = re.compile(r"^(?P<indent>\s*)(?P<fence>`{3,}|~{3,})\s*(?P<lang>[\w+-]*)")
HEADING = re.compile(r"^#{1,6}\s+(?P<title>.+?)\s*#*\s*$")
EXITS = re.compile(r"\bexits? (\d+)\b")


@dataclass(frozen=True)
class Command:
    """One line of a shell block: what runs, where the README has it, the exit code it documents."""

    line: int
    text: str
    expected: int


@dataclass(frozen=True)
class Block:
    """One fenced code block of the README."""

    line: int  # the opening fence
    lang: str
    section: str
    body: tuple[tuple[int, str], ...]  # (README line, text) of each line inside the fences
    marker: str | None = None
    reason: str | None = None
    setup: tuple[Command, ...] = field(default=())

    @property
    def id(self) -> str:
        slug = re.sub(r"[^a-z0-9]+", "-", self.section.lower()).strip("-") or "top"
        return f"L{self.line}-{self.lang}-{slug}"

    @property
    def source(self) -> str:
        """The block's code, placed at its README lines so tracebacks give README line numbers."""
        first = self.body[0][0] if self.body else self.line + 1
        return "\n" * (first - 1) + "\n".join(text for _, text in self.body) + "\n"

    @property
    def first_code_line(self) -> str:
        return next((t.strip() for _, t in self.body if t.strip() and not t.strip().startswith("#")), "")


def split_comment(line: str) -> tuple[str, str]:
    """A shell line's command and its trailing comment (a ``#`` after a blank, outside quotes)."""
    quote, escaped = None, False
    for i, ch in enumerate(line):
        if escaped:
            escaped = False
        elif ch == "\\" and quote != "'":
            escaped = True
        elif quote:
            quote = None if ch == quote else quote
        elif ch in "'\"":
            quote = ch
        elif ch == "#" and (i == 0 or line[i - 1].isspace()):
            return line[:i].rstrip(), line[i + 1 :].strip()
    return line.rstrip(), ""


def commands(block: Block) -> list[Command]:
    """A shell block's commands in order, continuations joined, comments and blank lines skipped."""
    out, pending, start = [], "", None
    for lineno, raw in block.body:
        if start is None:
            start = lineno
        if raw.rstrip().endswith("\\") and not raw.lstrip().startswith("#"):
            pending += raw.strip()[:-1].strip() + " "
            continue
        text, comment = split_comment(pending + raw.strip())
        pending, here, start = "", start, None
        if not text.strip():
            continue
        m = EXITS.search(comment)
        out.append(Command(here, text.strip(), int(m.group(1)) if m else 0))
    return out


def parse(text: str) -> tuple[list[Block], list[str]]:
    """The README's fenced blocks, with their markers, and every misplaced or unknown marker."""
    lines = text.splitlines()
    blocks, problems = [], []
    section, i = "", 0
    pending_marker: tuple[int, str, str | None] | None = None
    while i < len(lines):
        lineno, line = i + 1, lines[i]
        fence = FENCE.match(line)
        if fence:
            indent, mark = fence.group("indent"), fence.group("fence")
            body, j = [], i + 1
            while j < len(lines) and not lines[j].strip().startswith(mark[0] * len(mark)):
                body.append((j + 1, lines[j][len(indent) :] if lines[j].startswith(indent) else lines[j]))
                j += 1
            if j == len(lines):
                problems.append(f"README.md:{lineno}: a code fence that never closes")
            lang = fence.group("lang").lower()
            kind, reason = (pending_marker[1], pending_marker[2]) if pending_marker else (None, None)
            if kind and lang not in SHELL_LANGS | PYTHON_LANGS:
                problems.append(f"README.md:{pending_marker[0]}: a readme-test marker before a {lang or 'plain'} block, which is not run")
            blocks.append(Block(lineno, lang, section, tuple(body), kind, reason))
            pending_marker, i = None, j + 1
            continue
        marker = MARKER.match(line)
        if pending_marker and line.strip():
            problems.append(f"README.md:{pending_marker[0]}: a readme-test marker not just before a code block")
            pending_marker = None
        if marker:
            kind, reason = marker.group("kind"), (marker.group("reason") or "").strip()
            if kind not in MARKER_KINDS:
                problems.append(f"README.md:{lineno}: unknown readme-test marker {kind!r} (known: {sorted(MARKER_KINDS)})")
            elif not reason:
                problems.append(f"README.md:{lineno}: a readme-test {kind} marker needs a reason in parentheses")
            else:
                pending_marker = (lineno, kind, reason)
        elif MARKER_LIKE.search(line) and "<!--" in line:
            problems.append(f"README.md:{lineno}: a readme-test comment this test cannot read: {line.strip()!r}")
        heading = HEADING.match(line)
        if heading:
            section = heading.group("title")
        i += 1
    return _split_setup(blocks), problems


def _split_setup(blocks: list[Block]) -> list[Block]:
    """The first shell block with its set-up parts (joined by ``&&``) moved to ``setup``."""
    for n, block in enumerate(blocks):
        if block.lang not in SHELL_LANGS:
            continue
        setup, body = [], []
        for lineno, raw in block.body:
            text, comment = split_comment(raw)
            parts = [p.strip() for p in text.split("&&")]
            setup += [Command(lineno, p, 0) for p in parts if SETUP.search(p)]
            kept = [p for p in parts if p and not SETUP.search(p)]
            if kept:
                body.append((lineno, " && ".join(kept) + (f"  # {comment}" if comment else "")))
        blocks[n] = Block(block.line, block.lang, block.section, tuple(body), block.marker, block.reason, tuple(setup))
        break
    return blocks


BLOCKS, PROBLEMS = parse(README.read_text())
SHELL_BLOCKS = [b for b in BLOCKS if b.lang in SHELL_LANGS]
PYTHON_BLOCKS = [b for b in BLOCKS if b.lang in PYTHON_LANGS]


def _params(blocks: list[Block]):
    out = []
    for b in blocks:
        marks = []
        if b.marker == "skip":
            marks.append(pytest.mark.skip(reason=f"README.md:{b.line}: {b.reason}"))
        elif b.marker == "slow" and os.environ.get("EMGRID_README_SLOW") != "1":
            marks.append(pytest.mark.skip(reason=f"README.md:{b.line}: slow ({b.reason}); EMGRID_README_SLOW=1 runs it"))
        out.append(pytest.param(b, id=b.id, marks=marks))
    return out


def _is_run(block: Block) -> bool:
    return block.marker is None or (block.marker == "slow" and os.environ.get("EMGRID_README_SLOW") == "1")


# ---------------------------------------------------------------------------------- the folder


def fresh_clone(root: Path) -> Path:
    """A folder laid out as a new clone's root, as far as the README's commands read it."""
    root.mkdir(parents=True, exist_ok=True)
    shutil.copytree(ROOT / "examples", root / "examples", ignore=shutil.ignore_patterns("out", "__pycache__"))
    return root


def shims(bindir: Path) -> Path:
    """``emgrid``, ``python`` and ``python3`` as the interpreter running the tests has them."""
    bindir.mkdir(parents=True, exist_ok=True)
    script = Path(sys.executable).parent / "emgrid"
    emgrid = f'exec "{script}" "$@"' if script.exists() else f'exec "{sys.executable}" -m emgrid.cli.main "$@"'
    for name, body in {"emgrid": emgrid, "python": f'exec "{sys.executable}" "$@"', "python3": f'exec "{sys.executable}" "$@"'}.items():
        path = bindir / name
        path.write_text(f"#!/bin/sh\n{body}\n")
        path.chmod(0o755)
    return bindir


def user_env(bindir: Path | None = None) -> dict[str, str]:
    env = dict(os.environ)
    env.pop("EMGRID_FAULT", None)
    env.setdefault("MPLBACKEND", "Agg")
    for var in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"):
        env.setdefault(var, "1")  # a shared two-core CI machine; emgrid limits its workers itself
    if bindir is not None:
        env["PATH"] = f"{bindir}{os.pathsep}{env.get('PATH', '')}"
    return env


def run(argv: list[str], cwd: Path, env: dict[str, str], timeout: float) -> tuple[int | None, str]:
    """Exit code (None on timeout) and combined output of a command; its whole group ends with it."""
    proc = subprocess.Popen(argv, cwd=cwd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True)
    try:
        out, _ = proc.communicate(timeout=timeout)
        return proc.returncode, out
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        out, _ = proc.communicate()
        return None, out
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()


def tail(text: str, n: int = OUTPUT_TAIL_LINES) -> str:
    lines = text.rstrip().splitlines()
    return "\n".join((["..."] if len(lines) > n else []) + lines[-n:])


def _expected_failures(failures: list[str], known: list[str], passed_known: list[str]) -> None:
    """Fails on any unexpected failure or fixed known bug; marks the case xfail on known bugs."""
    if passed_known:
        failures += [f"{k}\n  now passes: remove it from KNOWN_BUGS in tests/test_readme.py" for k in passed_known]
    if failures:
        pytest.fail("\n\n".join(failures), pytrace=False)
    if known:
        pytest.xfail("; ".join(known))


# ------------------------------------------------------------------------------------ the tests


def test_the_readme_markers_are_well_formed():
    assert not PROBLEMS, "\n".join(PROBLEMS)


def test_the_readme_has_blocks_to_run():
    assert SHELL_BLOCKS and PYTHON_BLOCKS and SHELL_BLOCKS[0].setup, "the README parser found no commands"


def test_the_setup_commands_are_what_ci_runs():
    """The README's first commands (venv, pip install, the test command) are .ci/run's, verbatim."""
    ci = CI_SCRIPT.read_text()
    missing = [f"README.md:{c.line}: {c.text}" for c in SHELL_BLOCKS[0].setup if c.text not in ci]
    assert not missing, "README set-up commands that .ci/run does not run:\n" + "\n".join(missing)


def test_every_known_bug_names_a_readme_command():
    texts = {c.text for b in SHELL_BLOCKS for c in commands(b)} | {b.first_code_line for b in PYTHON_BLOCKS}
    stale = [k for k in KNOWN_BUGS if k not in texts]
    assert not stale, f"KNOWN_BUGS entries the README no longer has: {stale}"


@pytest.mark.parametrize("block", _params(SHELL_BLOCKS))
def test_shell_block(block: Block, tmp_path: Path):
    cmds = commands(block)
    if not cmds:
        pytest.skip(f"README.md:{block.line}: only set-up commands, which CI runs (see test_the_setup_commands_are_what_ci_runs)")
    if shutil.which("bash") is None:
        pytest.skip("bash is not installed")
    work, env = fresh_clone(tmp_path / "clone"), user_env(shims(tmp_path / "bin"))
    _expected_failures(*check_commands(cmds, work, env, KNOWN_BUGS))


def check_commands(cmds: list[Command], work: Path, env: dict[str, str], known_bugs: dict[str, str]):
    """Runs the commands in order in ``work``: (failures, known bugs seen, known bugs that passed)."""
    failures, known, passed_known = [], [], []
    for cmd in cmds:
        text = re.sub(r"(?<![\w./-])\.venv/bin/(?=\w)", "", cmd.text)
        rc, out = run(["bash", "-c", f"set -o pipefail\n{text}"], work, env, COMMAND_TIMEOUT_S)
        ok = rc == cmd.expected
        where = f"README.md:{cmd.line}: `{cmd.text}`"
        if cmd.text in known_bugs:
            (passed_known if ok else known).append(f"{where}: {known_bugs[cmd.text]}")
        elif not ok:
            got = f"timed out after {COMMAND_TIMEOUT_S} s" if rc is None else f"exited {rc}"
            failures.append(f"{where} {got}, the README documents {cmd.expected}; its output:\n{textwrap.indent(tail(out), '  ')}")
    return failures, known, passed_known


_DRIVER = '''\
"""Runs a README section's Python blocks in order in one namespace, recording each outcome."""
import json, sys, traceback

if __name__ == "__main__":
    blocks, results = json.load(open(sys.argv[1])), {}
    namespace = sys.modules["__main__"].__dict__
    for block in blocks:
        print(f"[readme-test] block at README.md:{block['line']}", flush=True)
        try:
            exec(compile(block["source"], "README.md", "exec"), namespace)
            results[block["line"]] = None
        except BaseException:
            results[block["line"]] = traceback.format_exc()
        sys.stdout.flush(); sys.stderr.flush()
        with open(sys.argv[2], "w") as f:
            json.dump(results, f)
'''

_SECTIONS: dict[str, tuple[dict[str, str | None], str, int | None]] = {}


def run_section(section: str, tmp_root: Path) -> tuple[dict[str, str | None], str, int | None]:
    """Each run block's traceback (None: it ran) in the section, the output, the exit code."""
    if section not in _SECTIONS:
        blocks = [b for b in PYTHON_BLOCKS if b.section == section and _is_run(b)]
        here = tmp_root / re.sub(r"\W+", "-", section or "top")
        work, aux = fresh_clone(here / "clone"), here / "driver"
        aux.mkdir()
        (aux / "driver.py").write_text(_DRIVER)
        (aux / "blocks.json").write_text(json.dumps([{"line": b.line, "source": b.source} for b in blocks]))
        rc, out = run([sys.executable, str(aux / "driver.py"), str(aux / "blocks.json"), str(aux / "results.json")], work, user_env(), SECTION_TIMEOUT_S)
        results = json.loads((aux / "results.json").read_text()) if (aux / "results.json").exists() else {}
        _SECTIONS[section] = (results, out, rc)
    return _SECTIONS[section]


@pytest.mark.parametrize("block", _params(PYTHON_BLOCKS))
def test_python_block(block: Block, tmp_path_factory: pytest.TempPathFactory):
    results, out, rc = run_section(block.section, tmp_path_factory.mktemp("readme-python", numbered=True))
    where = f"README.md:{block.line} (python, section {block.section!r})"
    if str(block.line) not in results:
        why = f"timed out after {SECTION_TIMEOUT_S} s" if rc is None else f"did not run (the section's interpreter exited {rc})"
        failure = f"{where} {why}; the section's output:\n{textwrap.indent(tail(out), '  ')}"
    elif results[str(block.line)] is not None:
        failure = f"{where} raised:\n{textwrap.indent(results[str(block.line)], '  ')}"
    else:
        failure = None
    key = block.first_code_line
    if key in KNOWN_BUGS:
        if failure is None:
            _expected_failures([], [], [f"{where}"])
        _expected_failures([], [f"{where}: {KNOWN_BUGS[key]}"], [])
    if failure:
        pytest.fail(failure, pytrace=False)


# ------------------------------------------------------------------------- the parser itself

_SAMPLE = """\
# tool

```bash
python3 -m venv .venv && .venv/bin/pip install -e . && .venv/bin/emgrid demo
.venv/bin/python -m pytest -q
```

## Use

<!-- readme-test: skip (needs a cluster) -->

```bash
# a comment line
emgrid fit a.toml --max-iter 2   # exits 1: stops on max_iter
emgrid plan "a # b.toml" \\
    --json  # the plan
```

```python
x = 1
```

<!-- readme-test: skipp (typo) -->
```text
not run
```
<!-- readme-test: slow (a reason) -->
prose between the marker and its block
"""


def test_the_parser_reads_markers_commands_exit_codes_and_setup():
    blocks, problems = parse(_SAMPLE)
    assert [(b.line, b.lang, b.section, b.marker) for b in blocks] == [
        (3, "bash", "tool", None), (12, "bash", "Use", "skip"), (19, "python", "Use", None), (24, "text", "Use", None)]
    assert [c.text for c in blocks[0].setup] == ["python3 -m venv .venv", ".venv/bin/pip install -e .", ".venv/bin/python -m pytest -q"]
    assert commands(blocks[0]) == [Command(4, ".venv/bin/emgrid demo", 0)]
    assert blocks[1].reason == "needs a cluster"
    assert commands(blocks[1]) == [Command(14, "emgrid fit a.toml --max-iter 2", 1), Command(15, 'emgrid plan "a # b.toml" --json', 0)]
    assert blocks[2].source.splitlines()[19] == "x = 1"  # README line 20 is the code's line 20
    assert [p.split(":")[1] for p in problems] == ["23", "27"]  # the unknown kind, the marker before prose


def test_a_command_fails_on_another_exit_code_and_a_known_bug_on_passing(tmp_path: Path):
    cmds = [Command(1, "exit 3", 3), Command(2, "echo oops; false", 0), Command(3, ".venv/bin/emgrid --help | head -1", 0), Command(4, "true", 0)]
    failures, known, passed = check_commands(cmds, tmp_path, user_env(shims(tmp_path / "bin")), {"true": "a bug"})
    assert len(failures) == 1 and failures[0].startswith("README.md:2: `echo oops; false` exited 1, the README documents 0") and "oops" in failures[0]
    assert known == [] and passed == ["README.md:4: `true`: a bug"]
