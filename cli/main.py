"""`corral`: the command line for operators. The `corral` group, its global options,
and the one place where API failures become one line on stderr."""
import click

from corral.shared.clients import Rejected, Unreachable

from . import (accounts, arrays, audit, concurrency, config, events, jobs, login, nodes, quotas, schedules, tokens,
               usage)
from .common import CliError, Env, base_urls

DEFAULT_ADDR = "http://127.0.0.1:9001"
DEFAULT_REGISTRY_ADDR = "http://127.0.0.1:9000"


class CorralGroup(click.Group):
    """Turns the clients' failures into one clear line on stderr, never a traceback."""

    def invoke(self, ctx: click.Context):
        try:
            return super().invoke(ctx)
        except Unreachable as exc:
            env = ctx.find_object(Env)
            raise (env.unreachable(exc) if env else CliError(str(exc))) from None
        except Rejected as exc:
            env = ctx.find_object(Env)
            raise (env.rejected(exc) if env else CliError(exc.message)) from None


@click.group(cls=CorralGroup, context_settings={"help_option_names": ["-h", "--help"], "max_content_width": 100})
@click.option("--addr", envvar="CORRAL_ADDR", default=DEFAULT_ADDR, show_default=True, metavar="URL",
              help="The scheduler's address; several comma-separated (replicas) are tried in order "
                   "[env CORRAL_ADDR].")
@click.option("--registry-addr", envvar="CORRAL_REGISTRY_ADDR", default=DEFAULT_REGISTRY_ADDR, show_default=True,
              metavar="URL", help="The registry's address, or several comma-separated [env CORRAL_REGISTRY_ADDR].")
@click.option("--token", envvar="CORRAL_TOKEN", metavar="TOKEN",
              help="Bearer token sent with every request [env CORRAL_TOKEN].")
@click.option("--ca-bundle", envvar="CORRAL_CA_BUNDLE", metavar="FILE",
              type=click.Path(exists=True, dir_okay=False, readable=True),
              help="CA certificates that verify https:// servers (default: the system's) [env CORRAL_CA_BUNDLE].")
@click.version_option(package_name="corral", prog_name="corral")
@click.pass_context
def cli(ctx: click.Context, addr: str, registry_addr: str, token: str | None, ca_bundle: str | None) -> None:
    """Submit and follow jobs, look at nodes and services of a Corral cluster.

    Without --token and CORRAL_TOKEN, the token `corral login` stored is sent to the
    scheduler it was checked against; without --addr and CORRAL_ADDR, that scheduler is
    the one asked."""
    addr_given = ctx.get_parameter_source("addr") is not click.core.ParameterSource.DEFAULT
    stored = config.Login(None, None) if token and addr_given else config.stored()
    if not addr_given and stored.addr:
        addr = stored.addr
    login_token = stored.token if stored.addr and base_urls(stored.addr) == base_urls(addr) else None
    env = Env(addr, registry_addr, token, ca_bundle=ca_bundle, login_token=login_token)
    ctx.obj = env
    ctx.call_on_close(env.close)


cli.add_command(jobs.job)
cli.add_command(nodes.node)
cli.add_command(nodes.service)
cli.add_command(arrays.array)
cli.add_command(concurrency.concurrency)
cli.add_command(schedules.schedule)
cli.add_command(events.events)
cli.add_command(login.login)
cli.add_command(login.logout)
cli.add_command(login.whoami)
cli.add_command(accounts.admin)
accounts.admin.add_command(tokens.token)
accounts.team.add_command(quotas.quota)
cli.add_command(audit.audit)
cli.add_command(usage.usage)


def main() -> None:
    cli(prog_name="corral")
