package rank

import (
	"encoding/json"
	"fmt"
)

// A snapshot is an execution's score rows as one value: what a Scores read returns for it, every
// stored copy with its position, with the EVALUATIONS sequence through which it is complete (every
// evaluation up to that sequence of the lineage's stream, and every one of earlier eras, is among
// its rows). The ranker writes one after it commits an execution's
// evaluations; composers read it instead of ClickHouse when it is complete through the sequence
// they wait for, so N composer replicas do not read the same rows from ClickHouse N times.
// It names the store lineage its rows were read from (Lineage.ID): a composer takes it only while
// the store's lineage is that one, so a refilled, rebuilt or recreated store, or a stream made
// again with its sequences starting over, invalidates every snapshot written before.
type snapshot struct {
	Through uint64        `json:"complete_through"`
	Lineage string        `json:"lineage,omitempty"`
	Rows    []snapshotRow `json:"rows"`
}

// Derivation is what a snapshot was derived from: the sequence its rows are complete through, and
// the store lineage they were read from.
type Derivation struct {
	Through uint64
	Lineage string
}

type snapshotRow struct {
	Team  string  `json:"t"`
	Event string  `json:"e"`
	Round int     `json:"r"`
	Name  string  `json:"n"`
	Score float64 `json:"s"`
	AtUs  int64   `json:"a"`
	Seq   uint64  `json:"q"`
	Era   uint32  `json:"g,omitempty"` // absent: era 0 (snapshots written before eras)
}

// Snapshot encodes the rows with what they were derived from.
func (ev *Evaluations) Snapshot(d Derivation) ([]byte, error) {
	s := snapshot{Through: d.Through, Lineage: d.Lineage, Rows: make([]snapshotRow, len(ev.rows))}
	for i, r := range ev.rows {
		s.Rows[i] = snapshotRow{Team: r.TeamID, Event: r.EventID, Round: r.Round, Name: r.TeamName, Score: r.Score, AtUs: r.AtMicros, Seq: r.Seq, Era: r.Era}
	}
	return json.Marshal(s)
}

// ParseSnapshot decodes a snapshot: the evaluations, and what they were derived from.
func ParseSnapshot(b []byte) (*Evaluations, Derivation, error) {
	var s snapshot
	if err := json.Unmarshal(b, &s); err != nil {
		return nil, Derivation{}, fmt.Errorf("rank: snapshot: %w", err)
	}
	ev := newEvaluations()
	ev.rows = make([]Stored, len(s.Rows))
	for i, r := range s.Rows {
		ev.rows[i] = Stored{RoundScore: RoundScore{TeamID: r.Team, EventID: r.Event, Round: r.Round, TeamName: r.Name, Score: r.Score, AtMicros: r.AtUs}, Pos: Pos{Era: r.Era, Seq: r.Seq}}
	}
	return ev, Derivation{Through: s.Through, Lineage: s.Lineage}, nil
}
