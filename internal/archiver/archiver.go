package archiver

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/tidwall/gjson"

	"github.com/podium-llm/podium/internal/chstore"
	"github.com/podium-llm/podium/internal/consume"
	"github.com/podium-llm/podium/internal/health"
	"github.com/podium-llm/podium/internal/retry"
	"github.com/podium-llm/podium/internal/settle"
	"github.com/podium-llm/podium/internal/sink"
	"github.com/podium-llm/podium/pkg/events"
)

// How a batch of PROMPTS records gets into the archive, whatever ClickHouse says (internal/sink
// writes it and keeps the table whole; the archiver's part):
//   - the archive is a view of the stream, kept whole by a sink.Keeper as the ranker's store is
//     (internal/sink/check.go: a table dropped, emptied or made again is filled again from the
//     whole PROMPTS stream, unready meanwhile, and readers read the stream until it is whole);
//     its lineage is noted in archive_lineage and published on the archiver's consumer
//     (events.MetaArchive*), and each row carries the era of the PROMPTS it came from;
//   - rows the table refuses (a column dropped or retyped by hand: a valid record fits a table as
//     the migrations made it) are held (sink.Hold) like a transient fault, unready naming
//     ClickHouse's error, never dead-lettered: readers take everything below the ack floor from the archive, so a
//     record acknowledged without its row would be lost to the audit;
//   - a message that is not a prompt.composed or prompt.failed CloudEvent is dead-lettered, once
//     the archive holds its bytes at its position for the audit log (chstore.NotARecordType):
//     when the stream's retention trims it, a check finds its position held.
// Messages are acknowledged only once ClickHouse has their rows, so nothing acknowledged is lost;
// batches are handled and settled with the keeper's lock (Keeper.Serial), so no ack moves the ack
// floor while the table is checked or filled again.

// archiveStore is what the archiver writes into ClickHouse.
type archiveStore interface {
	ArchivePrompts(ctx context.Context, recs []chstore.ArchivedPrompt) error
	Repair(ctx context.Context) ([]string, error)
}

var _ archiveStore = (*chstore.Store)(nil)

// archiver copies batches of PROMPTS records into ClickHouse.
type archiver struct {
	log        *slog.Logger
	js         jetstream.JetStream
	store      archiveStore
	lineages   sink.Table // the archive's lineage (chstore.Store.ArchiveLineages)
	settler    *settle.Settler
	m          *metrics
	batchSize  int
	batchBytes int
	// createDatabase makes the database again when it was dropped (Repair makes the tables).
	createDatabase func(ctx context.Context) error
	now            func() time.Time
	// offer hands each message delivered to the audit log's keeper (auditlog.Keeper.Offer), which
	// then need not read it again from the stream; nil when no log is kept.
	offer func(created time.Time, seq uint64, subject string, body []byte)
	// nc reads the operators' acceptances of a loss on AUDIT (loss.go; nil: a loss is never named).
	nc *nats.Conn

	// Readiness: writes ("clickhouse") is insert's: ClickHouse away, out of disk, or refusing
	// the rows; filled ("archive") is the keeper's: not checked against the stream yet, being
	// filled again, or a loss waited on.
	writes *health.Condition
	filled *health.Condition
	// sink writes batches of records (internal/sink, holding what the table refuses); keep keeps
	// the table a whole view of PROMPTS.
	sink *sink.Writer[chstore.ArchivedPrompt]
	keep *sink.Keeper[chstore.ArchivedPrompt]
}

// newSink is how the archiver writes records.
func newSink(st archiveStore, m *metrics, writes *health.Condition, log *slog.Logger) *sink.Writer[chstore.ArchivedPrompt] {
	return &sink.Writer[chstore.ArchivedPrompt]{Rows: "records", Table: "the prompts table", Insert: st.ArchivePrompts, Refusals: sink.Hold,
		Writes: writes, Log: log, Metrics: m.sink}
}

// newView is how the archiver fills its table again (internal/sink).
func newView(m *metrics, filled *health.Condition, log *slog.Logger) *sink.View {
	return &sink.View{What: "the prompts archive", Stream: events.StreamPrompts, Whole: filled, Log: log,
		Begin:   "the prompts archive is not whole; making it again and filling it from PROMPTS",
		Done:    "prompts archive made again and filled from PROMPTS",
		Metrics: sink.ViewMetrics{Refills: m.refills, Refilling: m.refilling, Errors: m.clickhouseErrors}}
}

// newKeeper is the keeper of the archive, tuned by each of tune (the service: its runtime; tests:
// their interleavings).
func (a *archiver) newKeeper(tune ...func(*sink.Config[chstore.ArchivedPrompt])) *sink.Keeper[chstore.ArchivedPrompt] {
	cfg := sink.Config[chstore.ArchivedPrompt]{
		JS:    a.js,
		Table: a.lineages,
		Rows: sink.Rows[chstore.ArchivedPrompt]{Filter: ">",
			Of: func(msg jetstream.Msg, at sink.Origin) (chstore.ArchivedPrompt, error) {
				rec, why, ok := rowOf(msg, at) // a message that is not a record: its row, as when consumed
				if !ok {
					return rec, why
				}
				return rec, nil
			},
			Key: chstore.ArchivedPrompt.Key},
		Write: a.sink.Write,
		Repair: func(ctx context.Context) error {
			if err := a.createDatabase(ctx); err != nil {
				return err
			}
			_, err := a.store.Repair(ctx)
			return err
		},
		View:       newView(a.m, a.filled, a.log),
		Log:        a.log,
		Keys:       sink.ArchiveKeys,
		Consumer:   events.ConsumerArchiver,
		Now:        a.now,
		Batch:      a.batchSize,
		BatchBytes: a.batchBytes,
	}
	if a.nc != nil {
		cfg.Losses = losses{a.nc}
	}
	for _, t := range tune {
		t(&cfg)
	}
	return sink.NewKeeper(cfg)
}

// newConditions registers the archiver's readiness conditions.
func newConditions(h *health.Health) (writes, filled *health.Condition) {
	return h.Condition("clickhouse", nil), h.Condition("archive", errors.New("the prompts archive is not checked against PROMPTS yet"))
}

// handle archives one batch, with the keeper's lock held: a record is done once ClickHouse has its
// row, and a message that is not a record is dead-lettered once ClickHouse has its row (rowOf).
func (a *archiver) handle(ctx context.Context, msgs []jetstream.Msg) consume.Result {
	// Nothing is archived beside a loss: the batch is given back until an operator accepted the
	// loss and the refill ran, which archives these too (the keeper's watch finds the acceptance).
	if l := a.keep.Loss(); l != nil {
		return consume.All(msgs, settle.RetryLater(fmt.Errorf("%w: %s", sink.ErrLossHeld, l.Lineage)))
	}
	created := consume.StreamOf(msgs[0])
	era, err := a.keep.EraOf(ctx, created)
	if err != nil {
		// Without the stream's era a row could not say which stream it came from: the batch goes
		// back, to come again once it is known.
		a.log.WarnContext(ctx, "the era of a batch's PROMPTS is not known; the batch is given back", "error", err)
		return consume.All(msgs, settle.RetryLater(err))
	}
	at := sink.Origin{Created: created, Era: era}
	res := consume.All(msgs, settle.Ack())
	recs := make([]chstore.ArchivedPrompt, 0, len(msgs))
	kept := make([]int, 0, len(msgs))
	for i, msg := range msgs {
		if md, err := msg.Metadata(); err == nil && a.offer != nil {
			a.offer(created, md.Sequence.Stream, msg.Subject(), msg.Data()) // the keeper's tree is of one stream
		}
		rec, why, ok := rowOf(msg, at)
		if !ok {
			a.m.records.WithLabelValues("dead_lettered").Inc()
			res.Outcomes[i] = settle.Reject(why.Error())
			continue
		}
		if why != nil {
			res.Outcomes[i] = settle.Reject(why.Error()) // once its row is stored
		}
		recs, kept = append(recs, rec), append(kept, i)
	}
	err = a.write(ctx, recs)
	if err == nil {
		// ClickHouse has them: the lag ends here, whatever follows.
		now := a.now()
		for _, rec := range recs {
			if rec.EventType != chstore.NotARecordType {
				a.m.lag.Observe(max(now.Sub(rec.Stored), 0).Seconds())
			}
		}
		err = a.keep.AnchorAfter(ctx, recs) // the first rows of a lineage noted while the table was empty
	}
	if err != nil {
		// Stopped past the shutdown timeout, or a loss, an era switch or a first anchor waited
		// on: given back, for whoever runs next.
		for _, i := range kept {
			res.Outcomes[i] = settle.RetryLater(err)
		}
		return res
	}
	archived := 0
	for _, rec := range recs {
		if rec.EventType == chstore.NotARecordType {
			a.m.records.WithLabelValues("dead_lettered").Inc()
			continue
		}
		archived++
	}
	a.m.records.WithLabelValues("archived").Add(float64(archived))
	return res
}

// rowOf is the archive's row of a PROMPTS message: its record's (why nil), or, for a message that
// is not a record, one that keeps its bytes at its position for the audit log alone
// (chstore.NotARecordType), with why it is not a record, to dead-letter it once the row is stored.
// false for a message without JetStream metadata, which has no position: dead-lettered at once.
func rowOf(msg jetstream.Msg, at sink.Origin) (rec chstore.ArchivedPrompt, why error, ok bool) {
	rec, why = record(msg, at)
	if why == nil {
		return rec, nil, true
	}
	md, err := msg.Metadata()
	if err != nil {
		return rec, why, false
	}
	stream := chstore.StreamID(at.Created)
	return chstore.ArchivedPrompt{EventID: chstore.NotARecordID(stream, md.Sequence.Stream), EventType: chstore.NotARecordType,
		Subject: msg.Subject(), Body: msg.Data(), StreamCreated: stream, Seq: md.Sequence.Stream, Era: at.Era, Stored: md.Timestamp.UTC()}, why, true
}

// recordFields reads the fields of a PROMPTS record that the archive's row indexes, and nothing
// else: the prompt and its messages, most of the bytes, go into the row inside the body as they
// are (the record is archived byte for byte). gjson checks that the body is JSON and walks the
// envelope and its data without decoding the values it passes, about four times faster than
// encoding/json, which decoded every value and scanned a record twice: most of the archiver's CPU
// (BenchmarkArchiverRecord). A field of another JSON type than its column's is an error; a
// missing one is left zero.
func recordFields(body []byte) (rec chstore.ArchivedPrompt, err error) {
	if !gjson.ValidBytes(body) {
		return rec, errors.New("not valid JSON")
	}
	var data gjson.Result
	str := func(v gjson.Result, name string, to *string) {
		if v.Type == gjson.Null {
			return // missing or null: left empty
		}
		if v.Type != gjson.String {
			err = fmt.Errorf("%s is %s, not a string", name, v.Type)
		}
		*to = v.Str
	}
	num := func(v gjson.Result, name string) uint64 {
		if v.Type == gjson.Null {
			return 0 // missing or null: left zero
		}
		if v.Type != gjson.Number || v.Num < 0 || v.Num != float64(int64(v.Num)) {
			err = fmt.Errorf("%s is %s, not a whole number", name, v.Raw)
			return 0
		}
		return v.Uint()
	}
	gjson.ParseBytes(body).ForEach(func(k, v gjson.Result) bool {
		switch k.Str {
		case "id":
			str(v, "id", &rec.EventID)
		case "type":
			str(v, "type", &rec.EventType)
		case "data":
			data = v
		}
		return err == nil
	})
	rec.Round = -1 // none: record refuses it
	strs := map[string]*string{"request_id": &rec.RequestID, "execution_id": &rec.ExecutionID, "team_id": &rec.TeamID, "prompt_sha256": &rec.PromptSHA256}
	data.ForEach(func(k, v gjson.Result) bool {
		if to, ok := strs[k.Str]; ok {
			str(v, "data."+k.Str, to)
			return err == nil
		}
		switch k.Str {
		case "round_number":
			if n := num(v, "data.round_number"); err == nil && n <= 1<<32-1 {
				rec.Round = int(n)
			}
		case "template":
			str(v.Get("name"), "data.template.name", &rec.TemplateName)
			rec.TemplateVersion = int(num(v.Get("version"), "data.template.version"))
		case "inputs":
			rec.EvaluationsSeq = num(v.Get("evaluations_seq"), "data.inputs.evaluations_seq")
		}
		return err == nil
	})
	return rec, err
}

// record reads one PROMPTS message, read from the stream at at, as the archive keeps it.
func record(msg jetstream.Msg, at sink.Origin) (chstore.ArchivedPrompt, error) {
	md, err := msg.Metadata()
	if err != nil {
		return chstore.ArchivedPrompt{}, fmt.Errorf("message without JetStream metadata: %w", err)
	}
	body := msg.Data()
	rec, err := recordOf(body)
	if err != nil {
		return chstore.ArchivedPrompt{}, err
	}
	// A message's data is its own (the client copies every payload it reads): kept, not copied.
	rec.Body, rec.Subject = body, msg.Subject()
	rec.StreamCreated, rec.Seq, rec.Era, rec.Stored = chstore.StreamID(at.Created), md.Sequence.Stream, at.Era, md.Timestamp.UTC()
	return rec, nil
}

// IsRecord says whether a PROMPTS message's body is one the archive keeps (the archiver
// dead-letters the others): what `podium audit check` expects the archive to hold.
func IsRecord(body []byte) bool {
	_, err := recordOf(body)
	return err == nil
}

// recordOf is what the archive keeps of a record's body, or why it is not a record.
func recordOf(body []byte) (chstore.ArchivedPrompt, error) {
	rec, err := recordFields(body)
	if err != nil {
		return chstore.ArchivedPrompt{}, whyNotARecord(body, err)
	}
	if rec.EventID == "" {
		return chstore.ArchivedPrompt{}, errors.New("a record without an id")
	}
	if rec.EventType != events.TypePromptComposed && rec.EventType != events.TypePromptFailed {
		return chstore.ArchivedPrompt{}, fmt.Errorf("type %q is not a prompt record", rec.EventType)
	}
	if rec.ExecutionID == "" || rec.TeamID == "" || rec.Round < 0 {
		return chstore.ArchivedPrompt{}, fmt.Errorf("%s %s names no execution, team and round", rec.EventType, rec.EventID)
	}
	if rec.EventType == events.TypePromptFailed {
		// Its data has no inputs, and a template only when its request was assigned one (which
		// compare reads from the body, by execution): the record is indexed as a failure, no more.
		rec.TemplateName, rec.TemplateVersion, rec.EvaluationsSeq, rec.PromptSHA256 = "", 0, 0, ""
	}
	return rec, nil
}

// whyNotARecord says what is wrong with a body that did not decode: not JSON, or data that is not
// of its type's shape.
func whyNotARecord(body []byte, err error) error {
	var env events.Envelope
	if jerr := json.Unmarshal(body, &env); jerr != nil {
		return fmt.Errorf("not a CloudEvent: %w", jerr)
	}
	return fmt.Errorf("%s data: %w", env.Type, err)
}

// write stores recs (see the top of this file), with the keeper's lock held: a table that lost
// its anchor (emptied, or dropped and made again by hand) is checked, and filled again, first, so
// that no record is acknowledged into a table readers would not read. It returns only once every
// record is stored, with ctx's error, or with sink.ErrLossHeld or sink.ErrBeforeInHand (the batch
// is given back).
func (a *archiver) write(ctx context.Context, recs []chstore.ArchivedPrompt) error {
	refills := 0
	for attempt := uint64(1); ; attempt++ {
		err := a.anchored(ctx)
		if err == nil {
			_, err = a.sink.Write(ctx, recs) // refused rows are held (sink.Hold): none comes back
		}
		switch {
		case err == nil:
			a.writes.Holds() // ClickHouse answers
			return nil
		case ctx.Err() != nil:
			return ctx.Err()
		case errors.Is(err, sink.ErrTableLost):
			if refills++; refills > 1 {
				// Made again and gone again: an operator (or a replica's refill) is at work. Each
				// refill reads the whole stream, so they are spaced out.
				if err := retry.Sleep(ctx, retry.Redelivery().Backoff(uint64(refills))); err != nil {
					return err
				}
			}
			err := a.keep.RefillLost(ctx)
			switch {
			case ctx.Err() != nil:
				return ctx.Err()
			case errors.Is(err, sink.ErrLossHeld), errors.Is(err, sink.ErrBeforeInHand):
				return err
			}
		case errors.Is(err, sink.ErrLossHeld), errors.Is(err, sink.ErrBeforeInHand):
			// Given back, the keeper's lock let go: a loss waits for an operator (the keeper's
			// watch finds the acceptance), and an era switch for a batch of the stream before
			// that needs the lock to commit.
			return err
		default: // the check failed: ClickHouse is away, as for an insert
			a.writes.Fail("inserts into the prompts table are failing; records are held, not lost")
			delay := retry.Redelivery().Backoff(attempt)
			a.log.WarnContext(ctx, "clickhouse check of the archive failed, will retry", "attempt", attempt, "retry_in", delay.String(), "error", err)
			if err := retry.Sleep(ctx, delay); err != nil {
				return err
			}
		}
	}
}

// anchored checks, before a batch is written, that the table still holds the anchor of the
// lineage published (one lookup through the primary index); when it does not, the keeper checks
// the table (and fills it again) first. sink.ErrTableLost when the table is missing.
func (a *archiver) anchored(ctx context.Context) error {
	if lin := a.keep.Published(); lin != nil && lin.Anchor != (chstore.RowKey{}) && a.keep.Loss() == nil {
		held, err := a.lineages.Holds(ctx, lin.Anchor)
		if chstore.FaultOf(err) == chstore.Missing {
			return fmt.Errorf("%w: %v", sink.ErrTableLost, err)
		}
		if err != nil || held {
			return err
		}
	}
	return a.keep.CheckLocked(ctx)
}

// watchConsumer keeps the backlog gauges current (what the stream holds that is not archived)
// and says loudly when PROMPTS' retention could trim a record before it is archived: JetStream
// cannot hold a record back for a consumer of a limits stream, so the archiver watches its lag
// against the stream's max_age.
func (a *archiver) watchConsumer(ctx context.Context, cons jetstream.Consumer, every time.Duration) {
	var warned time.Time
	retry.Every(ctx, every, func(ctx context.Context) {
		info, err := cons.Info(ctx)
		if err != nil {
			return
		}
		waiting := info.NumPending + uint64(info.NumAckPending)
		a.m.pending.Set(float64(waiting))
		age := time.Duration(0)
		if waiting > 0 {
			if stored, err := a.oldestUnarchived(ctx, info.AckFloor.Stream); err == nil {
				age = max(a.now().Sub(stored), 0)
			}
		}
		a.m.oldest.Set(age.Seconds())
		if maxAge := a.promptsMaxAge(ctx); maxAge > 0 && age > maxAge/2 && time.Since(warned) > time.Minute {
			warned = time.Now()
			a.log.ErrorContext(ctx, "the archive lags more than half PROMPTS' retention: records may be trimmed from the stream before they are archived",
				"oldest_unarchived", age.Round(time.Second).String(), "prompts_max_age", maxAge.String())
		}
	})
}

// promptsMaxAge is PROMPTS' max_age now (0: for ever, or unknown).
func (a *archiver) promptsMaxAge(ctx context.Context) time.Duration {
	st, err := a.js.Stream(ctx, events.StreamPrompts)
	if err != nil {
		return 0
	}
	return st.CachedInfo().Config.MaxAge
}

// warnRetention says at start what PROMPTS' limits mean for the archive.
func (a *archiver) warnRetention(ctx context.Context) {
	st, err := a.js.Stream(ctx, events.StreamPrompts)
	if err != nil {
		return
	}
	cfg := st.CachedInfo().Config
	if cfg.MaxAge > 0 {
		a.log.WarnContext(ctx, "PROMPTS trims records older than its max_age: the archive must never lag that much behind (alert PodiumArchiveLagging pages at 5m)", "prompts_max_age", cfg.MaxAge.String())
	}
	if cfg.MaxBytes > 0 || cfg.MaxMsgs > 0 {
		a.log.WarnContext(ctx, "PROMPTS trims its oldest records at its max_bytes or max_msgs whatever the archive holds: keep either far above a day of prompts", "prompts_max_bytes", cfg.MaxBytes, "prompts_max_msgs", cfg.MaxMsgs)
	}
}

// oldestUnarchived is when the stream stored the first record after the ack floor.
func (a *archiver) oldestUnarchived(ctx context.Context, floor uint64) (time.Time, error) {
	ctx, cancel := context.WithTimeout(ctx, 2*time.Second)
	defer cancel()
	st, err := a.js.Stream(ctx, events.StreamPrompts)
	if err != nil {
		return time.Time{}, err
	}
	msg, err := st.GetMsg(ctx, floor+1, jetstream.WithGetMsgSubject(">"))
	if err != nil {
		return time.Time{}, err
	}
	return msg.Time, nil
}
