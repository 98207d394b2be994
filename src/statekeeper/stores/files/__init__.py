"""The plain-files backend (``files:///dir``): JSON and JSONL a person can read.

`store` opens it; `layout` holds paths, locks and atomic writes, `sessions` heads and
transcript logs, `logs` the line formats, `records` records and event logs, and
`recovery` what happens to damaged files.
"""

from statekeeper.stores.files.layout import Recovery, UnsafePathError
from statekeeper.stores.files.store import FileStore, open_files

__all__ = ["FileStore", "Recovery", "UnsafePathError", "open_files"]
