"""Entry point: the ``quotagate`` command group and where subcommands are registered."""

from __future__ import annotations

import importlib

import click

# Which module of quotagate.cli holds each command; every module exposes a list COMMANDS of the
# click commands/groups it defines (tests/unit/test_cli_registry.py keeps the two equal).
# `quotagate X` imports X's module alone, not every command's dependencies (the worker's
# dispatcher, the lab's streaming package, the demo's multiprocessing): CLI startup is import
# time (docs/decisions/238-cli-lazy-commands.md). `quotagate --help` still imports them all,
# for each command's one-line help.
COMMAND_MODULES: dict[str, tuple[str, ...]] = {
    "admin": ("init", "tenant", "pool"),
    "cohorts": ("cohort",),
    "fair_share": ("fair-share",),
    "ledger": ("submit", "admit", "complete", "fail", "cancel", "expire", "show", "inspect", "explain", "check"),
    "demo": ("demo",),
    "rate": ("rate",),
    "retention": ("prune",),
    "server": ("serve",),
    "simulate": ("simulate",),
    "streaming": ("diagnose", "lab"),
    "streams": ("topic", "stream"),
    "api_tokens": ("api-token", "audit"),
    "worker": ("worker", "target", "lease"),
    "top": ("top",),
}
_MODULE_OF = {name: module for module, names in COMMAND_MODULES.items() for name in names}


class LazyGroup(click.Group):
    """A group that imports a command's module when the command is first asked for."""

    def list_commands(self, ctx: click.Context) -> list[str]:
        return sorted({*self.commands, *_MODULE_OF})

    def get_command(self, ctx: click.Context, cmd_name: str) -> click.Command | None:
        if cmd_name not in self.commands and cmd_name in _MODULE_OF:
            module = importlib.import_module(f"quotagate.cli.{_MODULE_OF[cmd_name]}")
            for command in module.COMMANDS:
                self.add_command(command)
        return self.commands.get(cmd_name)


@click.group(cls=LazyGroup, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(package_name="quotagate")
def cli() -> None:
    """quotagate: multi-tenant admission controller and quota ledger."""


def main() -> None:
    cli(prog_name="quotagate")
