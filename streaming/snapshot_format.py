"""The versioned bytes of the detector state the job keeps in Spark's state store.

Every value the operator writes (a bucket's detector, a partition's history)
starts with a four-byte header: ``FWS`` and the state format number. A reader
knows what it reads: values without the header are format 0, the plain pickles
written up to c80c2e7 (they load as before, restored by the classes'
``__setstate__`` and ``detectors.pickling``); a format newer than this release
knows is refused with a message saying what to do, instead of failing somewhere
inside unpickling with an attribute error.

The formats:

- 0: bare pickles (up to c80c2e7); 1: the same pickles behind the header.
- 2: a bucket's pending judgments live in their own state variable
  (streaming.pending_store), and its detector value no longer carries them.
  Format 0 and 1 detectors still do: they load with their judgments queued,
  and the operator moves them to the pending store at its next save. The
  number is raised so that a release reading format 1 at most refuses such a
  checkpoint instead of loading its detectors without their judgments.
- 3: a bucket's partition histories are kept :data:`streaming.state.GROUP_SIZE`
  to a state entry, in the ``partition_groups`` MapState, instead of one entry
  per partition in ``partitions``. A bucket whose detector value is of an
  earlier format has its ``partitions`` entries moved into groups when the
  operator first loads it (streaming.state.PartitionStore.adopt).
- 4: a bucket's remote segments are kept per partition, in the
  ``remote_partitions`` MapState (streaming.state.RemoteStore), instead of in
  the detector value, where formats 0 to 3 kept them by segment id
  (``RemoteView.segments``) beside their partitions' epoch ends. Such a
  detector value is read with :class:`_RemoteViewBefore4` in place of
  ``RemoteView``, its segments are put under their partitions, and the
  operator moves them to ``remote_partitions`` at its first load.
- 5: the records an offset-ordered log holds (detectors.redelivery.OffsetOrder)
  are pickled in chunks, once, instead of in its heap; the metadata log's
  chunks live in the ``held_chunks`` MapState (streaming.state.HeldChunkStore).
  Earlier formats load with their held records in the heap as they were
  (``OffsetOrder.__setstate__``), and chunk them at the next save. The number
  is raised so that a release of format 4 refuses such a checkpoint instead of
  failing on its held records.
- 6: each partition history in ``partition_groups`` is pickled as plain
  values (detectors.view.plain_history), not as its objects, which took
  three to five times as long to pickle. Histories
  pickled as objects (formats 3 to 5) still load, and are written the new way
  when they change; the number is raised so that a release of format 5
  refuses such a checkpoint instead of failing on its histories.

When the state's shape changes in a way old pickles cannot follow, raise
``FORMAT``, keep the old reader as a migration here, and add a checkpoint
written by the previous release under tests/data/upgrade.
"""

from __future__ import annotations

import io
import pickle
from typing import Any

from detectors.engine import Detector
from detectors.remote import PartitionSegments, RemoteView, Segment

MAGIC = b"FWS"
FORMAT = 6
# The first format that keeps partition histories in groups.
GROUPED_PARTITIONS = 3
# The first format that keeps remote segments apart from the detector value.
REMOTE_PARTITIONS = 4
_HEADER = MAGIC + bytes([FORMAT])


class StateFormatError(Exception):
    """The checkpoint holds state this release cannot read."""


def encode(state: Any) -> bytes:
    return _HEADER + pickle.dumps(state, protocol=pickle.HIGHEST_PROTOCOL)


def format_of(data: bytes | bytearray | memoryview) -> int:
    """The state format ``data`` was written in."""
    view = memoryview(data)
    return view[3] if view[:3] == MAGIC else 0


def decode(data: bytes | bytearray | memoryview) -> Any:
    view = memoryview(data)
    written = format_of(view)
    if written > FORMAT:
        raise StateFormatError(
            f"the checkpoint's state is in format {written}, written by a newer fencewatch; this "
            f"release reads formats 0 to {FORMAT}: run the release that wrote it, or start again "
            "with a new --checkpoint directory"
        )
    body = view[4:] if written else view  # format 0: a bare pickle, written up to c80c2e7
    if written >= REMOTE_PARTITIONS:
        return pickle.loads(body)
    state = _UnpicklerBefore4(io.BytesIO(body)).load()
    if isinstance(state, Detector):
        for cluster in state.clusters.values():
            if isinstance(cluster.remote, _RemoteViewBefore4):
                cluster.remote = cluster.remote.upgraded()
    return state


class _RemoteViewBefore4:
    """``detectors.remote.RemoteView`` as formats 0 to 3 pickled it: tracked
    segments by id, apart from their partitions' epoch ends. Restored either
    way it was pickled: called with its field values (detectors.pickling,
    from de81004), or made empty and given Python's default state of a slots
    object (before)."""

    def __init__(
        self,
        segments: dict[str, Segment] | None = None,
        partitions: dict[tuple[str, int], PartitionSegments] | None = None,
        deleting: dict[tuple[str, int], tuple[int, int | None]] | None = None,
    ) -> None:
        self.segments = {} if segments is None else segments
        self.partitions = {} if partitions is None else partitions
        self.deleting = {} if deleting is None else deleting

    def __setstate__(self, state: tuple[Any, dict[str, Any]]) -> None:
        self.__init__(**state[1])  # type: ignore[misc]

    def upgraded(self) -> RemoteView:
        for segment in self.segments.values():
            part = self.partitions.setdefault(segment.key, PartitionSegments())
            part.segments[segment.segment_id] = segment
        return RemoteView(self.partitions, self.deleting)


class _UnpicklerBefore4(pickle.Unpickler):
    def find_class(self, module: str, name: str) -> Any:
        if (module, name) == ("detectors.remote", "RemoteView"):
            return _RemoteViewBefore4
        return super().find_class(module, name)
