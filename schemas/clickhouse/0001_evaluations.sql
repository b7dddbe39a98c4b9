-- Every evaluation.completed the ranker accepted, one row per event id (replays of an id collapse
-- at merge time, and every read deduplicates by id before it ranks, so the merge state never
-- changes a result). The sort key starts with execution_id so that a leaderboard or history read
-- touches only the granules of its own execution. Types are those ClickHouse 18.16 and current
-- releases share: times are Int64 microseconds (no DateTime64 there) plus the producer's text.
CREATE TABLE IF NOT EXISTS evaluations (
    execution_id String,
    team_id String,
    round_number UInt32,
    event_id String,
    team_name String,
    overall_score Float64,
    metrics String,
    feedback String,
    submission String,
    submission_format String,
    evaluated_at String,
    evaluated_at_us Int64,
    event_source String,
    stream_seq UInt64
) ENGINE = ReplacingMergeTree()
PARTITION BY tuple()
ORDER BY (execution_id, team_id, round_number, event_id);
