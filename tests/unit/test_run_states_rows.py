"""A reference export's dataset rows as the per-sample token check reads them: views of the mapped list column,
across the record batches the export writes (4,096 rows each), never another row's tokens."""
from __future__ import annotations

import numpy as np
import pyarrow as pa

from pipeline.exports.run_states import _row_index


def test_every_row_is_its_own_across_record_batches(tmp_path):
    rows = [list(range(i, i + (i % 7))) for i in range(50)]  # some empty, lengths 0-6
    path = tmp_path / "data.arrow"
    schema = pa.schema([("input_ids", pa.list_(pa.int64()))])
    with pa.OSFile(str(path), "wb") as sink, pa.RecordBatchStreamWriter(sink, schema) as writer:
        for start in range(0, len(rows), 16):  # four batches, the last one short
            writer.write_batch(pa.record_batch({"input_ids": rows[start:start + 16]}, schema=schema))
    with pa.memory_map(str(path)) as source:
        column = pa.ipc.open_stream(source).read_all().column("input_ids")
    assert column.num_chunks == 4
    row = _row_index(column)
    for i, expected in enumerate(rows):
        found = row(i)
        assert found.dtype == np.int64 and found.tolist() == expected, i
