"""Files written whole or not at all: a temporary file in the same folder, then one rename."""
import os
from pathlib import Path


def write_atomic(path, write):
    """write(partial_path) fills a temporary file that then replaces `path` in one rename."""
    path = Path(path)
    # The suffix stays last so that writers choosing a format by extension (matplotlib) still can.
    partial = path.with_name(f".{path.stem}.{os.getpid()}.tmp{path.suffix}")
    try:
        write(partial)
        os.replace(partial, path)
    finally:
        partial.unlink(missing_ok=True)
