"""The user's config file: the scheduler's address and the personal token `corral login`
stored, kept where only its owner may read them.

The file is `$CORRAL_CONFIG`, else `$XDG_CONFIG_HOME/corral/config.json`, else
`~/.config/corral/config.json`: a JSON object, `{"addr", "token", "token_id", "user"}`.
It is written whole to a file of its own made with mode 0600 (never readable by others,
not for an instant) and renamed over the old one; a folder made for it gets mode 0700.
A file others may read or change is still used, with a warning on stderr, as ssh gives."""
import contextlib
import json
import os
import secrets
from dataclasses import dataclass

import click

FILE_MODE = 0o600
DIR_MODE = 0o700
OPEN_TO_OTHERS = 0o077  # any permission of the group's or others'
LOGIN_KEYS = ("token", "token_id", "user")  # what `corral logout` removes (the address stays)


def path() -> str:
    given = os.environ.get("CORRAL_CONFIG")
    if given:
        return os.path.expanduser(given)
    base = os.environ.get("XDG_CONFIG_HOME")
    if not base or not os.path.isabs(base):  # the XDG spec: a relative one is ignored
        base = os.path.join(os.path.expanduser("~"), ".config")
    return os.path.join(base, "corral", "config.json")


def warn(message: str) -> None:
    click.echo(f"corral: warning: {message}", err=True)


def read() -> dict:
    """The file's settings: {} when there is none, or (with a warning) when it cannot be
    read as a JSON object."""
    file = path()
    try:
        with open(file, encoding="utf-8") as f:
            mode = os.fstat(f.fileno()).st_mode & 0o777
            text = f.read()
    except FileNotFoundError:
        return {}
    except (OSError, UnicodeDecodeError) as exc:
        warn(f"ignoring {file}: {exc}")
        return {}
    if mode & OPEN_TO_OTHERS:
        warn(f"{file} is open to others (mode {mode:04o}); it may hold a token: chmod 600 {file}")
    try:
        settings = json.loads(text)
    except ValueError:
        settings = None
    if not isinstance(settings, dict):
        warn(f"ignoring {file}: not a JSON object")
        return {}
    return settings


def write(settings: dict) -> str:
    """Replace the file with `settings` (OSError when it cannot be written); its path."""
    file = path()
    folder = os.path.dirname(os.path.abspath(file))
    make_folder(folder)
    temporary = os.path.join(folder, f".{os.path.basename(file)}.{secrets.token_hex(8)}.tmp")
    # O_EXCL: a file of our own, made with its final mode (no link followed, nobody's old file).
    fd = os.open(temporary, os.O_WRONLY | os.O_CREAT | os.O_EXCL, FILE_MODE)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            os.fchmod(f.fileno(), FILE_MODE)  # exactly 0600, whatever the umask
            f.write(json.dumps(settings, indent=2) + "\n")
            f.flush()
            os.fsync(f.fileno())
        os.replace(temporary, file)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(temporary)
        raise
    return file


def make_folder(folder: str) -> None:
    """The folder and those above it that are missing, each made with mode 0700."""
    if os.path.isdir(folder):
        return
    parent = os.path.dirname(folder)
    if parent != folder:
        make_folder(parent)
    try:
        os.mkdir(folder, DIR_MODE)
    except FileExistsError:
        return
    os.chmod(folder, DIR_MODE)  # exactly 0700, whatever the umask


@dataclass(frozen=True)
class Login:
    """What `corral login` stored."""

    addr: str | None
    token: str | None
    token_id: str | None = None
    user: str | None = None

    @classmethod
    def of(cls, settings: dict) -> "Login":
        def text(key: str) -> str | None:
            value = settings.get(key)
            return value if isinstance(value, str) and value else None
        return cls(text("addr"), text("token"), text("token_id"), text("user"))


def stored() -> Login:
    return Login.of(read())


def store(addr: str, token: str, token_id: str | None, user: str | None) -> str:
    """Keep the address and the token (the file's other settings stay); the file's path."""
    settings = read()
    settings.update(addr=addr, token=token, token_id=token_id, user=user)
    return write(settings)


def forget() -> Login | None:
    """Remove the stored token (the address stays); what was stored, None when no token was."""
    settings = read()
    if not settings.get("token"):
        return None
    login = Login.of(settings)
    for key in LOGIN_KEYS:
        settings.pop(key, None)
    write(settings)
    return login
