"""What every `corral` command shares: the clients, the clock, errors and JSON output."""
import json
import time
from typing import Callable

import click

from corral.shared.clients import RegistryClient, Rejected, Unreachable
from corral.shared.settings import split_urls

from . import format as fmt
from .client import CliSchedulerClient

# Seams for the tests: what time it is, and how to wait between polls.
clock = time.time
sleep = time.sleep


class CliError(click.ClickException):
    """One line on stderr, `corral: …`, and exit code 1 (or `exit_code`)."""

    def __init__(self, message: str, exit_code: int = 1):
        super().__init__(message)
        self.exit_code = exit_code

    def show(self, file=None) -> None:
        click.echo(f"corral: {self.format_message()}", file=file, err=True)


def base_url(addr: str) -> str:
    """`host:port` is taken as `http://host:port`."""
    addr = addr.strip().rstrip("/")
    return addr if "://" in addr else "http://" + addr


def base_urls(addrs: str) -> list[str]:
    """A server's addresses: one, or its replicas' comma-separated (base_url each)."""
    try:
        return [base_url(addr) for addr in split_urls(addrs)]
    except ValueError:
        raise CliError(f"no address in {addrs!r}", exit_code=2) from None


class Env:
    """What every command gets (`ctx.obj`): the addresses (lists: a server's
    replicas, tried in order), the clients and the clock."""

    def __init__(self, addr: str, registry_addr: str, token: str | None, ca_bundle: str | None = None,
                 login_token: str | None = None):
        self.addrs = base_urls(addr)
        self.registry_addrs = base_urls(registry_addr)
        self.token = token or None
        # The token `corral login` stored, for the scheduler it was checked against: only
        # when no token is given (--token, CORRAL_TOKEN).
        self.login_token = None if self.token else login_token or None
        self.verify = ca_bundle or True  # requests' `verify`: a CA bundle, or the system's CAs
        self.subject: str | None = None  # the id a command is about, to prefix its errors
        self._scheduler = self._registry = None

    @property
    def scheduler(self) -> CliSchedulerClient:
        if self._scheduler is None:
            self._scheduler = self.scheduler_with(self.token or self.login_token)
        return self._scheduler

    def scheduler_with(self, token: str | None) -> CliSchedulerClient:
        """A client of the scheduler that sends `token` (the caller closes it)."""
        return CliSchedulerClient(self.addrs, token=token, verify=self.verify)

    @property
    def registry(self) -> RegistryClient:
        if self._registry is None:
            self._registry = RegistryClient(self.registry_addrs, token=self.token, verify=self.verify)
        return self._registry

    def now(self) -> float:
        return clock()

    def sleep(self, seconds: float) -> None:
        sleep(seconds)

    def close(self) -> None:
        for client in (self._scheduler, self._registry):
            if client is not None:
                client.close()

    def server_name(self, url: str | None) -> str:
        if url in self.registry_addrs:
            return "registry"
        return "scheduler"

    def unreachable(self, exc: Unreachable) -> CliError:
        """`cannot reach the scheduler at URL: why`, naming every URL the call went to."""
        tried = exc.tried or [(self.addrs[0], exc.reason)]
        name = self.server_name(tried[0][0])
        if len(tried) == 1:
            return CliError(f"cannot reach the {name} at {tried[0][0]}: {tried[0][1]}")
        return CliError(f"cannot reach the {name} at " + ", ".join(f"{url} ({why})" for url, why in tried))

    def rejected(self, exc: Rejected) -> CliError:
        message = exc.message
        if exc.status == 404 and message == "no such resource":
            message += " (the server may be older than this corral)"
        if exc.status == 401 or exc.status == 403:
            message += (" (check the token `corral login` stored, or give --token / CORRAL_TOKEN)"
                        if self.login_token else " (check --token / CORRAL_TOKEN)")
        return CliError(message if not self.subject or names_first(message, self.subject)
                        else f"{self.subject}: {message}")


def names_first(message: str, subject: str) -> bool:
    """Whether the server's message already starts with the id (`job-1 is already done`):
    then it is not prefixed again. `job-1` does not start `job-12 is …`."""
    rest = message[len(subject):] if message.startswith(subject) else None
    return rest is not None and (not rest or not (rest[0].isalnum() or rest[0] in "._-"))


def echo_json(data) -> None:
    """Exactly the API's JSON, one document."""
    click.echo(json.dumps(data, indent=2, ensure_ascii=False))


def note(message: str) -> None:
    """A line for the person at the terminal (stderr, so stdout stays the data)."""
    click.echo(message, err=True)


def echo_list(items: list, as_json: bool, nothing: str, table: Callable[[list], object]) -> None:
    """A list's output: the API's JSON; `nothing` on stderr when it is empty; else its table."""
    if as_json:
        echo_json(items)
    elif not items:
        note(nothing)
    else:
        fmt.emit(table(items))


def json_option(help: str = "Print the API's JSON (one document) instead of a table."):
    return click.option("--json", "as_json", is_flag=True, help=help)
