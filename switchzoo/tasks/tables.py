"""Rows of named columns from local files: TSV with a header line, JSON Lines, or Parquet (the
format datasets on the Hugging Face hub are stored in). Each row is a dict with its place
(``file:line``, Parquet: ``file:row N``) under ``"_where"``, so that a row missing a column is
named where it is.

    rows = read("train.jsonl")            # [{"sentence": ..., "label": 1, "_where": "train.jsonl:1"}]
"""
from __future__ import annotations

import json
import pathlib

from switchzoo.data import files

FORMATS = (".tsv", ".jsonl", ".parquet")     # gzip allowed for the text formats (.tsv.gz ...)


def _format(path: pathlib.Path) -> str:
    for suffix in FORMATS:
        if path.name.endswith(suffix) or path.name.endswith(suffix + ".gz"):
            return suffix
    raise ValueError(f"{path}: unknown file format; name it .tsv (a header line of column "
                     "names), .jsonl (one JSON object per line) or .parquet")


def read(path) -> list[dict]:
    path = pathlib.Path(path).expanduser()
    kind = _format(path)
    if not path.is_file():
        raise FileNotFoundError(f"task file {path} does not exist; check the task's files")
    if kind == ".parquet":
        import pyarrow.parquet as pq
        try:
            table = pq.read_table(path).to_pylist()
        except Exception as e:             # pyarrow's ArrowInvalid and kin
            raise ValueError(f"{path}: not a readable Parquet file ({str(e).splitlines()[0]})"
                             "; write it again (pandas.DataFrame.to_parquet)") from None
        return [{**row, "_where": f"{path}:row {i + 1}"} for i, row in enumerate(table)]
    rows, header = [], None
    for number, line in files._lines(path):
        where = f"{path}:{number}"
        if kind == ".jsonl":
            try:
                row = json.loads(line)
            except json.JSONDecodeError as e:
                raise ValueError(f"{where}: not a JSON object ({e.msg}); write one JSON object "
                                 "per line") from None
            if not isinstance(row, dict):
                raise ValueError(f"{where}: a JSON {type(row).__name__}, not an object; write "
                                 "one JSON object per line")
        elif header is None:
            header = [name.strip() for name in line.split("\t")]
            continue
        else:
            fields = line.split("\t")
            if len(fields) != len(header):
                raise ValueError(f"{where}: {len(fields)} TAB-separated fields where the header "
                                 f"names {len(header)} ({', '.join(header)}); fix or remove it")
            row = dict(zip(header, fields))
        rows.append({**row, "_where": where})
    if not rows:
        raise ValueError(f"{path} holds no rows; give a file with a header line and rows (TSV) "
                         "or one JSON object per line")
    return rows


def column(row: dict, name: str):
    """``row[name]``, or one line naming the file, the line and the columns it has."""
    if name not in row:
        have = ", ".join(k for k in row if k != "_where")
        raise ValueError(f"{row.get('_where', 'a row')}: no column '{name}' (it has {have}); "
                         "name the task's columns as the file does")
    return row[name]
