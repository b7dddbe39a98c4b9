package chstore_test

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"math"
	"os"
	"os/exec"
	"path/filepath"
	"reflect"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/ClickHouse/clickhouse-go/v2"
	"github.com/ClickHouse/clickhouse-go/v2/lib/driver"

	"github.com/podium-llm/podium/internal/chstore"
	"github.com/podium-llm/podium/internal/testenv"
	"github.com/podium-llm/podium/pkg/events"
	"github.com/podium-llm/podium/pkg/rank"
)

// TestCurrentClickHouseAgrees runs the migrations and the store's read queries in chDB, an
// embedded current ClickHouse engine (npm chdb, locked in chdb/package-lock.json), and in the
// 18.16 server the other tests use, over the same rows, and compares every result. It covers the
// SQL: that the DDL is accepted and makes the same table, and that each read returns the same
// rows with the same values. It cannot cover what chDB has no part in: the native protocol, the
// server's configuration, replication and quorum writes, merges over time.
func TestCurrentClickHouseAgrees(t *testing.T) {
	if testing.Short() {
		t.Skip("needs ClickHouse and Node")
	}
	node, err := exec.LookPath("node")
	_, modErr := os.Stat(filepath.Join("chdb", "node_modules", "chdb"))
	if err != nil || modErr != nil {
		if os.Getenv("CI") != "" {
			t.Fatalf("node or chdb missing (make test installs it: npm install --no-save --prefix internal/chstore/chdb): %v %v", err, modErr)
		}
		t.Skip("node or internal/chstore/chdb/node_modules missing: run `npm install --no-save --prefix internal/chstore/chdb`")
	}
	ctx := context.Background()
	st, cfg := testenv.Store(t, true)

	// A tournament with what reads must get right: replays of an id (another round, another
	// score), ties, re-evaluations, unicode, extreme floats, empty metrics, offsets.
	var recs []rank.Record
	scores := []float64{82.5, 70.25, 70.25, -3, 1e-05, 1e16, 99.99, 0.1 + 0.2}
	seq := uint64(0)
	for x := range 3 {
		exec := fmt.Sprintf("exec-%d", x)
		for tm := range 4 {
			team := fmt.Sprintf("team-%d", tm)
			for r := 1; r <= 3; r++ {
				seq++
				metrics := []events.Metric{{MetricName: "Clarity", Score: scores[int(seq)%len(scores)], EvaluatorComment: "「明確」 <ok> & \"quoted\""}}
				if seq%5 == 0 {
					metrics = nil
				}
				recs = append(recs, rank.Record{EventID: fmt.Sprintf("ev-%03d", seq), Source: "orchestrator/test", Seq: seq, EvaluationCompleted: events.EvaluationCompleted{
					ExecutionID: exec, TeamID: team, TeamName: fmt.Sprintf("Team %d «%s»", tm, exec), RoundNumber: r,
					Submission:  events.Submission{Content: fmt.Sprintf("submission %d\nwith\ttabs, 'quotes' and \\ backslashes", seq), Format: "md"},
					Evaluation:  events.Scores{OverallScore: scores[int(seq)%len(scores)], Metrics: metrics, Feedback: "feedback ✓"},
					EvaluatedAt: time.Date(2026, 11, 21, 9, 0, int(seq), 123456000, time.FixedZone("JST", 9*3600))}})
			}
		}
	}
	replay := recs[4]
	replay.Seq, replay.RoundNumber, replay.Evaluation.OverallScore = seq+1, 7, 1000
	recs = append(recs, replay)
	if err := st.Insert(ctx, recs); err != nil {
		t.Fatal(err)
	}
	// Two lineages, the newer of them noted twice: the read takes the last of the newest.
	for _, l := range []chstore.Lineage{{Epoch: 1, Stream: "2026-11-21T09:00:00Z"}, {Epoch: 2, Stream: "2026-11-21T09:00:00Z"},
		{Epoch: 2, Stream: "2026-11-21T09:00:00Z", Anchor: chstore.RowKey{ExecutionID: "exec-1", TeamID: "team-2", EventID: "ev-019", Pos: rank.Pos{Seq: 19}}, Whole: true}} {
		if err := st.NoteLineage(ctx, l); err != nil {
			t.Fatal(err)
		}
	}

	conn, err := clickhouse.Open(&clickhouse.Options{Addr: cfg.Addrs, Auth: clickhouse.Auth{Database: cfg.Database}})
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	// The chDB side: the migrations as the ranker runs them, then the same rows, as stored.
	type statement struct {
		SQL    string `json:"sql"`
		Select bool   `json:"select"`
	}
	var script []statement
	migs, err := chstore.Migrations()
	if err != nil {
		t.Fatal(err)
	}
	script = append(script, statement{SQL: chstore.MigrationsTable})
	for _, m := range migs {
		for _, s := range m.Statements {
			script = append(script, statement{SQL: s})
		}
	}
	const cols = `execution_id, team_id, round_number, event_id, team_name, overall_score, metrics, feedback, submission, submission_format, evaluated_at, evaluated_at_us, event_source, stream_seq`
	stored := query(t, conn, "SELECT "+cols+" FROM evaluations")
	var values []string
	for _, row := range stored.raw {
		var lits []string
		for _, v := range row {
			lits = append(lits, literal(v))
		}
		values = append(values, "("+strings.Join(lits, ", ")+")")
	}
	// One insert of every stored row, copies of an id included. A current server collapses the
	// copies of a sorting key within one inserted block (optimize_on_insert), 18.16 does not; the
	// ranker never writes two copies of an id in one insert (a batch keeps one), so the rows as
	// 18.16 holds them are what a current server would hold too, which the setting reproduces.
	script = append(script, statement{SQL: "INSERT INTO evaluations (" + cols + ") SETTINGS optimize_on_insert = 0 VALUES " + strings.Join(values, ", ")})
	const lineageCols = `epoch, version, stream_created, era, anchor_execution_id, anchor_team_id, anchor_event_id, anchor_era, anchor_seq, through, whole, noted_at, floor_era`
	values = values[:0]
	for _, row := range query(t, conn, "SELECT "+lineageCols+" FROM store_lineage").raw {
		var lits []string
		for _, v := range row {
			lits = append(lits, literal(v))
		}
		values = append(values, "("+strings.Join(lits, ", ")+")")
	}
	script = append(script, statement{SQL: "INSERT INTO store_lineage (" + lineageCols + ") SETTINGS optimize_on_insert = 0 VALUES " + strings.Join(values, ", ")})

	// The reads, with their arguments bound as clickhouse-go binds them.
	reads := []struct {
		name string
		sql  string
	}{
		{"scores", bind(chstore.ScoresQuery, []string{"exec-0", "exec-2", "unknown"})},
		{"team scores", bind(chstore.TeamScoresQuery, "exec-1", "team-2")},
		{"scores, anchored", bind(chstore.AnchoredScores, []string{"exec-0", "exec-2"}, "exec-1", "team-2", "ev-019")},
		{"scores, anchor lost", bind(chstore.AnchoredScores, []string{"exec-0"}, "exec-1", "team-2", "no-such-event")},
		{"contents", bind(chstore.ContentsQuery(2, false), "exec-0", "team-0", "exec-2", "team-3", uint32(0), chstore.RoundLimit(3))},
		{"contents, every round", bind(chstore.ContentsQuery(1, false), "exec-0", "team-0", uint32(0), chstore.RoundLimit(0))},
		{"contents, anchored", bind(chstore.ContentsQuery(1, true), "exec-0", "team-0", uint32(0), chstore.RoundLimit(2), "exec-1", "team-2", "ev-019")},
		{"executions", chstore.ExecutionsQuery},
		{"status", chstore.StatusQuery},
		{"lineage", chstore.LineageQuery},
		{"anchor held", bind(chstore.HoldsQuery, "exec-1", "team-2", "ev-019")},
		{"executions, anchored", bind(chstore.AnchoredExecutionsQuery(chstore.AnchorAt), "exec-1", "team-2", "ev-019", uint32(0), uint32(0), uint64(19))},
		{"team scores, anchored", bind(chstore.AnchoredTeamScoresQuery, "exec-0", "team-1", "exec-1", "team-2", "ev-019")},
		{"newest row", chstore.NewestRowQuery},
		{"the table's columns", "SELECT name, type FROM system.columns WHERE database = currentDatabase() AND table = 'evaluations' ORDER BY name"},
	}
	for _, r := range reads {
		script = append(script, statement{SQL: r.sql, Select: true})
	}
	in, _ := json.Marshal(script)
	cmd := exec.Command(node, filepath.Join("chdb", "run.mjs"))
	cmd.Stdin = bytes.NewReader(in)
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("chdb: %v\n%s", err, stderr.String())
	}
	var got struct {
		Version string            `json:"version"`
		Results []json.RawMessage `json:"results"`
	}
	if err := json.Unmarshal(out, &got); err != nil {
		t.Fatalf("chdb wrote %.300s: %v", out, err)
	}
	for i, st := range script[:len(script)-len(reads)] {
		var e struct{ Error string }
		// A column a later migration adds to tables made before it is there already: as the
		// store does (execDDL), that is done.
		if json.Unmarshal(got.Results[i], &e) == nil && e.Error != "" && !(chstore.AddsColumn(st.SQL) && strings.Contains(e.Error, "already exists")) {
			t.Fatalf("chDB %s refused %.200s: %s", got.Version, st.SQL, e.Error)
		}
	}
	t.Logf("chDB %s ran %d migration statements and %d rows; comparing %d reads with 18.16", got.Version, len(script)-len(reads)-2, len(stored.raw), len(reads))
	for i, r := range reads {
		want := query(t, conn, r.sql)
		var lines []string
		if err := json.Unmarshal(got.Results[len(script)-len(reads)+i], &lines); err != nil {
			t.Errorf("%s: chDB: %s", r.name, got.Results[len(script)-len(reads)+i])
			continue
		}
		have := normalizeLines(t, lines, want.kinds)
		if !slices.Equal(want.rows, have) {
			t.Errorf("%s: 18.16 and chDB %s differ\n18.16: %q\nchDB:  %q", r.name, got.Version, want.rows, have)
		}
		if len(want.rows) == 0 {
			t.Errorf("%s: no rows: the comparison shows nothing", r.name)
		}
	}
}

// result is a query's rows as normalized strings, sorted (reads have no ORDER BY), and each
// column's kind.
type result struct {
	raw   [][]any
	rows  []string
	kinds []reflect.Kind
}

func query(t *testing.T, conn driver.Conn, q string) result {
	t.Helper()
	rows, err := conn.Query(context.Background(), q)
	if err != nil {
		t.Fatalf("18.16: %s: %v", q, err)
	}
	defer rows.Close()
	var r result
	types := rows.ColumnTypes()
	for _, ct := range types {
		r.kinds = append(r.kinds, ct.ScanType().Kind())
	}
	for rows.Next() {
		ptrs := make([]any, len(types))
		for i, ct := range types {
			ptrs[i] = reflect.New(ct.ScanType()).Interface()
		}
		if err := rows.Scan(ptrs...); err != nil {
			t.Fatal(err)
		}
		var vals []any
		var cells []string
		for _, p := range ptrs {
			v := reflect.ValueOf(p).Elem().Interface()
			vals = append(vals, v)
			cells = append(cells, normalize(v))
		}
		r.raw = append(r.raw, vals)
		r.rows = append(r.rows, strings.Join(cells, " | "))
	}
	slices.Sort(r.rows)
	return r
}

// normalize writes a value so that both engines' outputs compare: floats by their shortest form.
func normalize(v any) string {
	switch x := v.(type) {
	case float64:
		return strconv.FormatFloat(x, 'g', -1, 64)
	case string:
		return strconv.Quote(x)
	}
	return fmt.Sprint(v)
}

// normalizeLines reads chDB's JSONCompactEachRow lines as the 18.16 side's kinds.
func normalizeLines(t *testing.T, lines []string, kinds []reflect.Kind) []string {
	t.Helper()
	var out []string
	for _, line := range lines {
		dec := json.NewDecoder(strings.NewReader(line))
		dec.UseNumber()
		var cells []any
		if err := dec.Decode(&cells); err != nil {
			t.Fatalf("chDB row %q: %v", line, err)
		}
		var norm []string
		for i, c := range cells {
			text := fmt.Sprint(c)
			if s, ok := c.(string); ok {
				text = s
			}
			switch {
			case i < len(kinds) && kinds[i] == reflect.Float64:
				f, err := strconv.ParseFloat(text, 64)
				if err != nil {
					t.Fatalf("chDB float %q: %v", text, err)
				}
				norm = append(norm, strconv.FormatFloat(f, 'g', -1, 64))
			case i < len(kinds) && kinds[i] == reflect.String:
				norm = append(norm, strconv.Quote(text))
			default:
				norm = append(norm, text)
			}
		}
		out = append(out, strings.Join(norm, " | "))
	}
	slices.Sort(out)
	return out
}

// literal writes a stored value as SQL.
func literal(v any) string {
	switch x := v.(type) {
	case string:
		return chstore.QuoteString(x)
	case float64:
		if math.IsInf(x, 0) || math.IsNaN(x) {
			panic("not finite")
		}
		return strconv.FormatFloat(x, 'g', -1, 64)
	case time.Time:
		return chstore.QuoteString(x.UTC().Format(time.DateTime))
	}
	return fmt.Sprint(v)
}

// bind replaces each ? of q with its argument as SQL, as the client binds them.
func bind(q string, args ...any) string {
	var b strings.Builder
	for _, part := range strings.Split(q, "?") {
		b.WriteString(part)
		if len(args) == 0 {
			break
		}
		switch a := args[0].(type) {
		case []string:
			var items []string
			for _, s := range a {
				items = append(items, chstore.QuoteString(s))
			}
			b.WriteString("(" + strings.Join(items, ", ") + ")")
		default:
			b.WriteString(literal(a))
		}
		args = args[1:]
	}
	return b.String()
}
