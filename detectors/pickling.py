"""Fast pickling for the small frozen dataclasses the detector's state is made of.

The streaming job stores each bucket's detector pickled in Spark's state store
and, whenever a micro-batch runs in another Python worker than the bucket's
previous one (Spark does not keep a task on one worker), unpickles it. Python
restores a frozen ``slots`` dataclass through ``dataclasses._dataclass_setstate``,
which looks up the class's fields again for every object. Pickled as "call the
class with these field values" instead, a detector 40k simulated events in
(1.1 MB pickled) loaded in 55 ms instead of 78 ms and pickled in 53 ms
instead of 63 ms (medians of 7; docs/performance.md).

Snapshots pickled before (which stored field tuples for ``__setstate__``)
still load, through a ``__setstate__`` that also gives fields added since
(always at the end, always with a default) their default: the constructor
call does the same for snapshots pickled the new way.
"""

from __future__ import annotations

import dataclasses
from operator import attrgetter
from typing import Any, TypeVar

T = TypeVar("T")


def fast_pickle(cls: type[T]) -> type[T]:
    """Pickle instances of the dataclass ``cls`` as ``cls(*field values)``.
    Every field must be a positional ``__init__`` parameter."""
    fields = dataclasses.fields(cls)  # type: ignore[arg-type]
    assert all(f.init and not f.kw_only for f in fields), f"{cls.__name__}: not every field is positional"
    values = attrgetter(*(f.name for f in fields))
    if len(fields) == 1:

        def __reduce__(self: Any) -> tuple[Any, ...]:
            return (cls, (values(self),))
    else:

        def __reduce__(self: Any) -> tuple[Any, ...]:
            return (cls, values(self))

    def __setstate__(self: Any, state: list[Any] | tuple[dict[str, Any] | None, dict[str, Any]]) -> None:
        # A frozen dataclass pickled its field values as a list (dataclasses' __getstate__);
        # any other slots class as (None, {slot: value}), Python's default for slots.
        if isinstance(state, list):
            values = dict(zip((f.name for f in fields), state, strict=False))
        else:
            values = {**(state[0] or {}), **state[1]}
        for f in fields:
            if f.name in values:
                value = values[f.name]
            elif f.default_factory is not dataclasses.MISSING:
                value = f.default_factory()
            else:
                assert f.default is not dataclasses.MISSING, (
                    f"{cls.__name__}.{f.name}: added without a default"
                )
                value = f.default
            object.__setattr__(self, f.name, value)  # the dataclass may be frozen

    cls.__reduce__ = __reduce__  # type: ignore[assignment,method-assign]
    cls.__setstate__ = __setstate__  # type: ignore[attr-defined]
    return cls
