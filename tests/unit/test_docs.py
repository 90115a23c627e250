"""The docs that code and tests cite are there and say what is true.

docs/invariants.md names, for each invariant, the tests that hold it: each named
test must exist. docs/decisions/README.md indexes the decisions: every file is in
it. The code and the tests cite only what is in the repository. Every option of
every command is in the docs.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path

import click

ROOT = Path(__file__).resolve().parents[2]
DECISIONS = ROOT / "docs" / "decisions"


def test_every_test_docs_invariants_names_exists() -> None:
    text = (ROOT / "docs" / "invariants.md").read_text()
    named = 0
    source = ""
    for line in text.splitlines():
        listed = re.match(r"- `(tests/[^`]+\.py)`", line)
        if listed:
            source = (ROOT / listed.group(1)).read_text()
        elif not line.startswith("  "):
            source = ""  # a continuation line names tests of the file above it
        for test in re.findall(r"`(test_\w+)`", line):
            assert source, f"{test} is named without its file"
            assert re.search(rf"^def {test}\(", source, flags=re.MULTILINE), test
            named += 1
    assert named >= 40
    numbers = [int(number) for number in re.findall(r"^## (\d+)\.", text, flags=re.MULTILINE)]
    assert numbers == list(range(1, 9))


def test_the_decision_index_lists_every_decision() -> None:
    index = (DECISIONS / "README.md").read_text()
    files = sorted(path.name for path in DECISIONS.glob("[0-9][0-9][0-9]-*.md"))
    linked = re.findall(r"\]\((\d{3}-[^)]+\.md)\)", index)
    assert sorted(linked) == files


def test_code_and_tests_cite_only_what_is_in_the_repository() -> None:
    outside = re.compile(r"seed[ _-]?0\d\d|DESIGN invariant|seeds/|invariants 1-2 hold", re.I)
    offenders = [
        f"{path.relative_to(ROOT)}:{number}"
        for folder in ("src", "tests", "benchmarks")
        for path in (ROOT / folder).rglob("*.py")
        if path.name != "test_docs.py"
        for number, line in enumerate(path.read_text().splitlines(), 1)
        if outside.search(line)
    ]
    assert offenders == []


def _commands(group: click.Group, context: click.Context,
              path: tuple[str, ...] = ()) -> Iterator[tuple[tuple[str, ...], click.Command]]:
    for name in group.list_commands(context):
        command = group.get_command(context, name)
        assert command is not None, name
        if isinstance(command, click.Group):
            yield from _commands(command, context, (*path, name))
        else:
            yield (*path, name), command


def test_every_option_of_every_command_is_in_the_docs() -> None:
    # --help shows an option to a user, who then looks for it in docs/ or the README:
    # each long option of each command must be written there at least once.
    from quotagate.cli.main import cli

    text = "\n".join(path.read_text() for path in
                     [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))])
    undocumented = [
        f"quotagate {' '.join(path)} {names[0]}"
        for path, command in _commands(cli, click.Context(cli))
        for option in command.params
        if isinstance(option, click.Option)
        and (names := [name for name in (*option.opts, *option.secondary_opts)
                       if name.startswith("--") and name != "--help"])
        and not any(re.search(re.escape(name) + r"(?![\w-])", text) for name in names)
    ]
    assert undocumented == []
