-- The prompts archive: every prompt.composed and prompt.failed of the PROMPTS audit stream, the
-- CloudEvent byte for byte (body), so a record read here is proved exactly as one read from the
-- stream (docs/reliability.md, "The prompts archive"). The archiver writes it (cmd/archiver).
-- The unit of deduplication is the event id, derived from the request id (one answer per
-- request): it ends the sort key, so a redelivered record collapses at merge time, and the version
-- falls as the time the stream stored it grows, so the merge keeps the first stored copy, as the
-- stream's duplicate window does (by time, not sequence: a stream made again starts its sequences
-- over). Reads collapse by event id the same way themselves, so the merge state never changes a
-- result.
--
-- The order is chosen for compression: a team's rounds follow each other, and each round's prompt
-- repeats most of the last one (its history grows by one round), so the block compressor finds
-- the previous round's text within its window. stream_created names the PROMPTS stream a row was
-- read from (its creation time): a stream made again restarts its sequences.
CREATE TABLE IF NOT EXISTS prompts (
    execution_id String,
    team_id String,
    round_number UInt32,
    event_id String,
    event_type String,
    request_id String,
    template_name String,
    template_version UInt32,
    evaluations_seq UInt64,
    prompt_sha256 String,
    subject String,
    body String,
    stream_created String,
    stream_seq UInt64,
    stream_era UInt32 DEFAULT 0, -- added by 0006_archive_lineage.sql to tables made before it
    stored_at_us Int64,
    keep_version UInt64 MATERIALIZED 18446744073709551615 - toUInt64(stored_at_us)
) ENGINE = ReplacingMergeTree(keep_version)
PARTITION BY tuple()
ORDER BY (execution_id, team_id, round_number, event_id)
SETTINGS index_granularity = 256;
