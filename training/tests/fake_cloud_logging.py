"""Cloud Logging for one log, in memory: what ml-goodput-measurement's recorder writes
and its calculator reads (the two methods and `flush` its cloud logger has)."""

from __future__ import annotations

from ml_goodput_measurement.src.goodput_utils import get_timestamp_from_log_entry


class FakeCloudLogging:
    def __init__(self) -> None:
        self.entries: list[dict] = []

    def write_cloud_logging_entry(self, entry: dict) -> None:
        self.entries.append(dict(entry))

    def read_cloud_logging_entries(self, start_time=None, end_time=None, last_entry_info=None):
        kept = [entry for entry in self.entries
                if (start_time is None or get_timestamp_from_log_entry(entry) > start_time)
                and (end_time is None or get_timestamp_from_log_entry(entry) <= end_time)]
        last = get_timestamp_from_log_entry(kept[-1]) if kept else None
        return kept, (last, str(len(self.entries)))

    def flush(self) -> None:
        pass
