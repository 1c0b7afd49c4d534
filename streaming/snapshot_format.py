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

When the state's shape changes in a way old pickles cannot follow, raise
``FORMAT``, keep the old reader as a migration here, and add a checkpoint
written by the previous release under tests/data/upgrade.
"""

from __future__ import annotations

import pickle
from typing import Any

MAGIC = b"FWS"
FORMAT = 3
# The first format that keeps partition histories in groups.
GROUPED_PARTITIONS = 3
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
    if view[:3] != MAGIC:
        return pickle.loads(view)  # format 0: a bare pickle, written up to c80c2e7
    written = view[3]
    if written > FORMAT:
        raise StateFormatError(
            f"the checkpoint's state is in format {written}, written by a newer fencewatch; this "
            f"release reads formats 0 to {FORMAT}: run the release that wrote it, or start again "
            "with a new --checkpoint directory"
        )
    return pickle.loads(view[4:])  # formats 1 to 3 differ in what the operator stores, not in bytes
