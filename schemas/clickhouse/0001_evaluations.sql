-- Every evaluation.completed the ranker accepted. The unit of deduplication is an event id on its
-- subject (execution, team): the sort key is exactly that, so a redelivered or replayed id
-- collapses at merge time, and the version falls as the stream sequence grows, so the merge keeps
-- the FIRST stored copy (a ReplacingMergeTree without a version would keep the last one). Reads
-- do the same collapse themselves (argMin by stream_seq), so the merge state never changes a
-- result within one era of the stream (0004_eras.sql: across eras reads keep the earlier era's
-- copy, the merge the lower sequence). The key starts with execution_id: a leaderboard or history read touches only its own
-- execution's granules. Types are those ClickHouse 18.16 and current releases share: times are
-- Int64 microseconds (no DateTime64 there) plus the producer's text. Granules are 256 rows, not
-- 8192: the composer reads one execution's submissions (tens of rows of KiBs), and a read decodes
-- whole granules of every column it names, so the default granule made each such read decompress
-- megabytes of other executions' submissions.
CREATE TABLE IF NOT EXISTS evaluations (
    execution_id String,
    team_id String,
    event_id String,
    round_number UInt32,
    team_name String,
    overall_score Float64,
    metrics String,
    feedback String,
    submission String,
    submission_format String,
    evaluated_at String,
    evaluated_at_us Int64,
    event_source String,
    stream_seq UInt64,
    stream_era UInt32 DEFAULT 0, -- added by 0004_eras.sql to tables made before it
    keep_version UInt64 MATERIALIZED 18446744073709551615 - stream_seq
) ENGINE = ReplacingMergeTree(keep_version)
PARTITION BY tuple()
ORDER BY (execution_id, team_id, event_id)
SETTINGS index_granularity = 256;
