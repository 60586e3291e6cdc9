"""A private file written whole: readers see the old contents or the new, never half."""
from __future__ import annotations

import os
import tempfile


def write_private(path: str, text: str, sync: bool = False) -> None:
    """Write `text` to `path`, mode 0600 whatever the umask, through a temporary file
    beside it renamed over it (a crash leaves the old file or the new one). `sync`:
    on the disk before the rename (a file a restart must find; replacing a file may
    then wait on the disk). The temporary file never outlives a failure. Raises OSError."""
    fd, tmp = tempfile.mkstemp(prefix=f".{os.path.basename(path)}.", dir=os.path.dirname(path) or ".")
    try:
        with os.fdopen(fd, "w") as f:  # mkstemp made it 0600
            f.write(text)
            if sync:
                f.flush()
                os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise
