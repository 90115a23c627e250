"""The CLI's table of where each command lives is the commands its modules define."""

from __future__ import annotations

import importlib
import pkgutil

import click

import quotagate.cli
from quotagate.cli.main import COMMAND_MODULES, cli


def test_every_module_with_commands_is_listed_with_exactly_its_commands() -> None:
    defined = {}
    for module_info in pkgutil.iter_modules(quotagate.cli.__path__):
        if module_info.name == "__main__":  # runs the CLI when imported
            continue
        module = importlib.import_module(f"quotagate.cli.{module_info.name}")
        if hasattr(module, "COMMANDS"):
            defined[module_info.name] = sorted(command.name for command in module.COMMANDS)
    assert {module: sorted(names) for module, names in COMMAND_MODULES.items()} == defined


def test_a_command_is_found_by_its_name_and_help_lists_them_all() -> None:
    context = click.Context(cli)
    names = cli.list_commands(context)
    assert names == sorted(name for names in COMMAND_MODULES.values() for name in names)
    for name in names:
        command = cli.get_command(context, name)
        assert command is not None and command.name == name
    assert cli.get_command(context, "no-such-command") is None
