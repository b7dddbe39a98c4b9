package console

import (
	"container/list"
	"context"
	"encoding/json"
	"errors"
	"strings"
	"sync"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/podium-llm/podium/internal/streamscan"
	"github.com/podium-llm/podium/pkg/events"
)

// cellKey names one team's round.
type cellKey struct {
	Team  string
	Round int
}

// cell is what the streams say of one team's round: requested (ROUNDS), then answered
// (PROMPTS): composed, or failed with its code. The evaluated state comes from the store.
type cell struct {
	Requested bool
	Composed  bool
	Tokens    int
	Cuts      int
	Failed    bool
	Code      string
}

// maxCells bounds one execution's index: 100 teams x 20 rounds is 2,000; past the bound a
// grid says it is incomplete rather than grow without end.
const maxCells = 100_000

// execIndex is the state of every round of one execution as its streams tell it, read once and
// then only from where it was left: a page of a running tournament reads what is new since the
// last page, never the whole audit log again.
type execIndex struct {
	mu         sync.Mutex // serializes catch-ups of this execution (one stream read at a time)
	roundsSeq  uint64     // last ROUNDS sequence read
	promptsSeq uint64     // last PROMPTS sequence read
	cells      map[cellKey]*cell
	order      events.ScoreOrder // of the latest request, desc when none says
	full       bool              // maxCells reached: later rounds are not indexed
}

// gridIndex keeps the indexes of the executions looked at last, at most size of them.
type gridIndex struct {
	js   jetstream.JetStream
	size int

	mu    sync.Mutex
	lru   *list.List // of *indexEntry, most recent first
	byID  map[string]*list.Element
	reads func(stream string, messages int) // counts what catch-ups read (metrics)
}

type indexEntry struct {
	id  string
	idx *execIndex
}

func newGridIndex(js jetstream.JetStream, size int, reads func(string, int)) *gridIndex {
	return &gridIndex{js: js, size: max(size, 1), lru: list.New(), byID: map[string]*list.Element{}, reads: reads}
}

// gridState is a copy of an index, for one page.
type gridState struct {
	cells map[cellKey]cell
	order events.ScoreOrder
	full  bool
}

// get returns the state of an execution, caught up with both streams.
func (g *gridIndex) get(ctx context.Context, executionID string) (gridState, error) {
	g.mu.Lock()
	var idx *execIndex
	if el, ok := g.byID[executionID]; ok {
		g.lru.MoveToFront(el)
		idx = el.Value.(*indexEntry).idx
	} else {
		idx = &execIndex{cells: map[cellKey]*cell{}, order: events.Desc}
		g.byID[executionID] = g.lru.PushFront(&indexEntry{executionID, idx})
		for g.lru.Len() > g.size {
			old := g.lru.Remove(g.lru.Back()).(*indexEntry)
			delete(g.byID, old.id)
		}
	}
	g.mu.Unlock()

	idx.mu.Lock()
	defer idx.mu.Unlock()
	if err := g.catchUp(ctx, events.StreamRounds, events.TypeRoundRequested+"."+executionID+".*", &idx.roundsSeq, idx.addRequest); err != nil {
		return gridState{}, err
	}
	// One reader for the catch-up, not kept: its buffer grows to the largest record read.
	answers := newAnswerReader()
	addAnswer := func(subject string, body []byte) { idx.addAnswer(answers, subject, body) }
	if err := g.catchUp(ctx, events.StreamPrompts, "prompt.*."+executionID+".*", &idx.promptsSeq, addAnswer); err != nil {
		return gridState{}, err
	}
	st := gridState{cells: make(map[cellKey]cell, len(idx.cells)), order: idx.order, full: idx.full}
	for k, c := range idx.cells {
		st.cells[k] = *c
	}
	return st, nil
}

// catchUp reads the messages of filter after *seq and hands each to add.
func (g *gridIndex) catchUp(ctx context.Context, stream, filter string, seq *uint64, add func(subject string, body []byte)) error {
	read, err := streamscan.Scan(ctx, g.js, stream, filter, *seq, func(msg jetstream.Msg) error {
		if md, err := msg.Metadata(); err == nil {
			*seq = md.Sequence.Stream
		}
		add(msg.Subject(), msg.Data())
		return nil
	})
	if errors.Is(err, jetstream.ErrStreamNotFound) {
		return nil // nothing was ever requested or answered
	}
	if g.reads != nil && read > 0 {
		g.reads(stream, read)
	}
	return err
}

// The few fields a grid needs of each event: decoding skips the rest (prompts, vars).
type requestFields struct {
	Data struct {
		TeamID      string `json:"team_id"`
		RoundNumber int    `json:"round_number"`
		ScoreOrder  any    `json:"score_order"`
	} `json:"data"`
}

func (idx *execIndex) cell(team string, round int) *cell {
	k := cellKey{team, round}
	c := idx.cells[k]
	if c == nil {
		if len(idx.cells) >= maxCells {
			idx.full = true
			return &cell{} // counted nowhere
		}
		c = &cell{}
		idx.cells[k] = c
	}
	return c
}

// addRequest records a round.requested. One that does not parse is the composer's to answer
// (and dead-letter); the grid shows what it answered.
func (idx *execIndex) addRequest(_ string, body []byte) {
	var f requestFields
	if json.Unmarshal(body, &f) != nil || !events.ValidIdentifier(f.Data.TeamID) || f.Data.RoundNumber < 1 {
		return
	}
	idx.cell(f.Data.TeamID, f.Data.RoundNumber).Requested = true
	if o, ok := f.order(); ok {
		idx.order = o
	}
}

// order is the request's score order, when it names a valid one.
func (f requestFields) order() (events.ScoreOrder, bool) {
	s, ok := f.Data.ScoreOrder.(string)
	if !ok {
		return "", false
	}
	return events.ParseScoreOrder(s)
}

// addAnswer records a prompt.composed or prompt.failed. A later answer of a round is a later
// request's: it replaces the earlier state, as `podium prompts show` shows the latest record.
func (idx *execIndex) addAnswer(answers *answerReader, subject string, body []byte) {
	a, err := answers.read(body)
	if err != nil || !events.ValidIdentifier(a.TeamID) || a.Round < 1 {
		return // round 0: a request too broken to name its round
	}
	c := idx.cell(a.TeamID, a.Round)
	c.Requested = true
	if strings.HasPrefix(subject, events.TypePromptFailed+".") {
		c.Composed, c.Failed, c.Code, c.Tokens, c.Cuts = false, true, a.Code, 0, 0
		return
	}
	c.Composed, c.Failed, c.Code, c.Tokens, c.Cuts = true, false, "", a.Tokens, a.Cuts
}
