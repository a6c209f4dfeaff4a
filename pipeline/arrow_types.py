"""Arrow schemas as Spark schemas (the capture and result schemas are written once,
in Arrow; Spark's own converter keeps the two in step)."""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import pyarrow as pa
    from pyspark.sql.types import StructType


def to_spark_schema(schema: pa.Schema) -> StructType:
    from pyspark.sql.pandas.types import from_arrow_schema

    return from_arrow_schema(schema)


__all__ = ["to_spark_schema"]
