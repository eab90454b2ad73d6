"""One loop over a data file's records for every reader (extract's samples, regenerate's prompts): the file checked
readable and digested, each record bounded in size (data/bounds.py), its stable sample id, and what cannot be read or
parsed a reject with its reason; `limit` counts records kept. What a kept record becomes is the reader's."""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Iterator, TypeVar

from pipeline.core.contracts import Reject
from pipeline.data.bounds import RecordBounds
from pipeline.data.ids import sample_id_for
from pipeline.data.records import RawRecord, iter_records
from pipeline.data.sources import RecordError, check_readable, file_digest

T = TypeVar("T")


@dataclass(frozen=True, kw_only=True)
class Source:
    path: Path
    name: str  # the file's name, as rejects and provenance name it
    digest: str
    bounds: RecordBounds


def source_of(path: str | Path, tokenizer: Any, max_length: int) -> Source:
    """The data file, checked readable (a directory, a FIFO or /dev/zero is no data file) and digested."""
    path = Path(path)
    check_readable(path)
    return Source(path=path, name=path.name, digest=file_digest(path), bounds=RecordBounds.of(tokenizer, max_length))


def read_each(source: Source, keep: Callable[[RawRecord, str], T], *, limit: int | None) -> Iterator[T | Reject]:
    """`keep(record, sample_id)` for every record in file order, or the Reject of a record it (RecordError) or the
    reading refused; stops once `limit` records were kept."""
    kept = 0
    for record in iter_records(source.path, max_record_bytes=source.bounds.max_record_bytes):
        if limit is not None and kept >= limit:
            break
        sample_id = sample_id_for(source.digest, record.row)
        try:
            if record.error is not None:
                why = f" ({source.bounds.why()})" if record.reason == "too_long" else ""
                raise RecordError(record.reason, f"{record.error}{why}")
            item = keep(record, sample_id)
        except RecordError as e:
            yield Reject(source=source.name, row=record.row, reason=e.reason, detail=e.detail, sample_id=sample_id)
            continue
        kept += 1
        yield item
