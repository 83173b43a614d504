"""The shared task board: task documents as JSON files in status folders, one lock, a watcher.

Modules: `task` (schema, validation, pure transitions), `parse` (dropped files to fields),
`drops` (the drop zone and when a file is finished), `ingest` (drops to tasks, mixed into the
board), `errors` (the board's exceptions), `index` (in-process claim index), `events`
(events.jsonl), `fsio` (atomic, link-safe writes), `lock` (the board's flock), `liveness` (is a
claim's holder alive), `fsinfo` (filesystem type, inotify limits), `watch` (watchdog wake-ups),
`redact` (API key values out of every text written), `store` (the protocol a board backend
implements), `board` (the filesystem backend), `why` (why a task is not moving, pure).

Imports only the standard library, watchdog, psutil and pyyaml; never `supervisor`
or `agents`.
"""

from .board import Board
from .errors import BoardError, ClaimLost, InvalidTransition, TaskNotFound
from .ingest import IngestReport
from .store import BoardStore
from .task import STATUSES, TaskError

__all__ = [
    "STATUSES",
    "Board",
    "BoardError",
    "BoardStore",
    "ClaimLost",
    "IngestReport",
    "InvalidTransition",
    "TaskError",
    "TaskNotFound",
]
