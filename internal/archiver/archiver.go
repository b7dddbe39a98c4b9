package archiver

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"

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
// writes it; the archiver's part):
//   - a missing database or table (dropped by an operator) is recreated from the migrations and
//     filled again from the whole PROMPTS stream (what it still holds), unready meanwhile: the
//     archive is a view of the stream, and a table made again empty would otherwise lack
//     everything archived before;
//   - rows the table refuses (a column dropped or retyped by hand: a valid record fits a table as
//     the migrations made it) are held (sink.Hold) like a transient fault, unready naming
//     ClickHouse's error, never dead-lettered: readers take everything below the ack floor from the archive, so a
//     record acknowledged without its row would be lost to the audit;
//   - a message that is not a prompt.composed or prompt.failed CloudEvent is dead-lettered, once
//     the archive holds its bytes at its position for the audit log (chstore.NotARecordType):
//     when the stream's retention trims it, a check finds its position held.
// Messages are acknowledged only once ClickHouse has their rows, so nothing acknowledged is lost.

// archiveStore is what the archiver needs of ClickHouse.
type archiveStore interface {
	ArchivePrompts(ctx context.Context, recs []chstore.ArchivedPrompt) error
	Repair(ctx context.Context) ([]string, error)
	Ping(ctx context.Context) error
	HoldsArchiveEpoch(ctx context.Context, epoch string) (bool, error)
	NoteArchiveEpoch(ctx context.Context, epoch string, at time.Time) error
}

var _ archiveStore = (*chstore.Store)(nil)

// archiver copies batches of PROMPTS records into ClickHouse.
type archiver struct {
	log        *slog.Logger
	js         jetstream.JetStream
	store      archiveStore
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

	// publish names the archive's epoch in the consumer's metadata (consume.Runtime.SetMetadata);
	// published reads the epoch the consumer names now (another replica may have published one).
	publish   func(ctx context.Context, md map[string]string) error
	published func(ctx context.Context) (string, error)

	// mu serializes what writes the table: a batch, and a refill the watcher starts.
	mu sync.Mutex

	epoch atomic.Pointer[string] // the epoch published: the table that holds its marker is whole

	// Readiness: writes ("clickhouse") is insert's: ClickHouse away, out of disk, or refusing
	// the rows; filled ("archive") is the epoch's: not checked against the consumer yet, or being
	// filled again from the stream.
	writes *health.Condition
	filled *health.Condition
	// sink writes batches of records (internal/sink, holding what the table refuses); view fills
	// the table again from PROMPTS.
	sink *sink.Writer[chstore.ArchivedPrompt]
	view *sink.View
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

// newConditions registers the archiver's readiness conditions.
func newConditions(h *health.Health) (writes, filled *health.Condition) {
	return h.Condition("clickhouse", nil), h.Condition("archive", errors.New("the prompts archive is not checked against its consumer yet"))
}

// handle archives one batch: a record is done once ClickHouse has its row, and a message that is
// not a record is dead-lettered once ClickHouse has its row (rowOf).
func (a *archiver) handle(ctx context.Context, msgs []jetstream.Msg) consume.Result {
	created, err := a.streamCreated(ctx)
	if err != nil {
		// Without the stream's identity a row could not say which stream it came from: the
		// batch goes back, to come again once the stream answers.
		a.log.WarnContext(ctx, "PROMPTS does not answer; the batch is given back", "error", err)
		return consume.All(msgs, settle.RetryLater(err))
	}
	res := consume.All(msgs, settle.Ack())
	recs := make([]chstore.ArchivedPrompt, 0, len(msgs))
	kept := make([]int, 0, len(msgs))
	for i, msg := range msgs {
		// Of the stream now, not one deleted since (streamOf): the keeper's tree is this one's.
		if md, err := msg.Metadata(); err == nil && a.offer != nil && !md.Timestamp.Before(created) {
			a.offer(created, md.Sequence.Stream, msg.Subject(), msg.Data())
		}
		rec, why, ok := rowOf(msg, created)
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
	err = a.writeLocked(ctx, recs)
	if err != nil {
		// Stopped past the shutdown timeout: given back, for whoever runs next.
		for _, i := range kept {
			res.Outcomes[i] = settle.RetryLater(err)
		}
		return res
	}
	now := a.now()
	archived := 0
	for _, rec := range recs {
		if rec.EventType == chstore.NotARecordType {
			a.m.records.WithLabelValues("dead_lettered").Inc()
			continue
		}
		archived++
		a.m.lag.Observe(max(now.Sub(rec.Stored), 0).Seconds())
	}
	a.m.records.WithLabelValues("archived").Add(float64(archived))
	return res
}

// rowOf is the archive's row of a PROMPTS message: its record's (why nil), or, for a message that
// is not a record, one that keeps its bytes at its position for the audit log alone
// (chstore.NotARecordType), with why it is not a record, to dead-letter it once the row is stored.
// false for a message without JetStream metadata, which has no position: dead-lettered at once.
func rowOf(msg jetstream.Msg, created time.Time) (rec chstore.ArchivedPrompt, why error, ok bool) {
	rec, why = record(msg, created)
	if why == nil {
		return rec, nil, true
	}
	md, err := msg.Metadata()
	if err != nil {
		return rec, why, false
	}
	stream := streamOf(md.Timestamp, created)
	return chstore.ArchivedPrompt{EventID: chstore.NotARecordID(stream, md.Sequence.Stream), EventType: chstore.NotARecordType,
		Subject: msg.Subject(), Body: msg.Data(), StreamCreated: stream, Seq: md.Sequence.Stream, Stored: md.Timestamp.UTC()}, why, true
}

// streamCreated is the identity of the PROMPTS stream now: its creation time.
func (a *archiver) streamCreated(ctx context.Context) (time.Time, error) {
	ctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	st, err := a.js.Stream(ctx, events.StreamPrompts)
	if err != nil {
		return time.Time{}, fmt.Errorf("look up %s: %w", events.StreamPrompts, err)
	}
	return st.CachedInfo().Created.UTC(), nil
}

// streamOf names the stream a record was stored in: the PROMPTS created at created, or, for a
// record stored before that (delivered by a stream deleted since), one that is not it, so that
// readers take it from the archive whatever the sequences of the stream made again.
func streamOf(stored, created time.Time) string {
	if stored.Before(created) {
		return "deleted before " + created.Format(time.RFC3339Nano)
	}
	return created.Format(time.RFC3339Nano)
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

// record reads one PROMPTS message as the archive keeps it.
func record(msg jetstream.Msg, created time.Time) (chstore.ArchivedPrompt, error) {
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
	rec.StreamCreated, rec.Seq, rec.Stored = streamOf(md.Timestamp, created), md.Sequence.Stream, md.Timestamp.UTC()
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

// writeLocked is write under a.mu, released however write ends (a panic of the driver included:
// the runtime's recovery then writes the batch's records again one at a time).
func (a *archiver) writeLocked(ctx context.Context, recs []chstore.ArchivedPrompt) error {
	a.mu.Lock()
	defer a.mu.Unlock()
	return a.write(ctx, recs)
}

// write stores recs (see the top of this file), in the archive the consumer's metadata names:
// a table that lost its epoch's marker (dropped, made again) is filled again first. It returns
// only once every record is stored, or with ctx's error. a.mu held.
func (a *archiver) write(ctx context.Context, recs []chstore.ArchivedPrompt) error {
	refills := 0
	for attempt := uint64(1); ; attempt++ {
		err := a.whole(ctx)
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
			if err := a.refill(ctx, err.Error()); err != nil {
				return err
			}
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

// whole checks that the table is the archive the consumer's ack floor speaks of: it holds the
// marker of the epoch the consumer names. The epoch this archiver knows comes first; when the table
// lacks it, the consumer may name a newer one another replica published after its own refill,
// which is then adopted. sink.ErrTableLost when the table holds neither.
func (a *archiver) whole(ctx context.Context) error {
	epoch := a.epoch.Load()
	if epoch == nil {
		return fmt.Errorf("%w: no epoch published yet", sink.ErrTableLost)
	}
	holds, err := a.store.HoldsArchiveEpoch(ctx, *epoch)
	if err != nil || holds {
		return err
	}
	if now, err := a.published(ctx); err == nil && now != "" && now != *epoch {
		if holds, err := a.store.HoldsArchiveEpoch(ctx, now); err == nil && holds {
			a.epoch.Store(&now)
			_ = a.publish(ctx, map[string]string{events.MetaArchiveEpoch: now}) // kept for a consumer made again
			return nil
		}
	}
	return fmt.Errorf("%w: the prompts table lost the marker of epoch %s (dropped, or made again)", sink.ErrTableLost, *epoch)
}

// refill makes the database and table again and archives what PROMPTS holds, from its first
// record, then notes a new epoch in the table and publishes it: the batch in hand is written
// after it. Rows are idempotent, so a refill that stops half way (a stop, a kill) is simply done
// again, by whoever finds the marker missing next. a.view tries it (internal/sink: the condition,
// the backoff, the metrics).
func (a *archiver) refill(ctx context.Context, why string) error {
	return a.view.Refill(ctx, why, func(ctx context.Context, _ uint64) (sink.Tried, error) {
		n, err := a.refillOnce(ctx)
		if err != nil {
			return sink.Tried{}, err
		}
		return sink.Tried{Attrs: []any{"records", n, "epoch", *a.epoch.Load()}}, nil
	})
}

// refillOnce is one try of refill; it returns how many records it wrote. A marker of the fill
// itself is noted first and must still be there at the end: a table dropped or made again while
// the refill wrote (by an operator, or another replica's refill) lost the rows before, and this
// try does not count.
func (a *archiver) refillOnce(ctx context.Context) (int, error) {
	if err := a.createDatabase(ctx); err != nil {
		return 0, err
	}
	if _, err := a.store.Repair(ctx); err != nil {
		return 0, err
	}
	fill := fmt.Sprintf("filling-%d", a.now().UnixNano())
	if err := a.store.NoteArchiveEpoch(ctx, fill, a.now()); err != nil {
		return 0, err
	}
	created, err := a.streamCreated(ctx)
	if err != nil {
		return 0, err
	}
	src := sink.Source[chstore.ArchivedPrompt]{JS: a.js, Stream: events.StreamPrompts, Filter: ">", Batch: a.batchSize, BatchBytes: a.batchBytes,
		Row: func(msg jetstream.Msg) (chstore.ArchivedPrompt, bool) {
			rec, _, ok := rowOf(msg, created) // a message that is not a record: its row, as when consumed
			return rec, ok
		}}
	done, err := sink.FillFrom(ctx, src, 0, a.sink.Write, nil)
	if err != nil {
		return done.Written, err
	}
	if holds, err := a.store.HoldsArchiveEpoch(ctx, fill); err != nil || !holds {
		return done.Written, fmt.Errorf("the prompts table was made again while it was filled (marker %s gone: %v)", fill, err)
	}
	return done.Written, a.newEpoch(ctx)
}

// newEpoch notes a new epoch in the table, then publishes it: from then on the table is the
// archive the consumer's ack floor speaks of.
func (a *archiver) newEpoch(ctx context.Context) error {
	now := a.now()
	epoch := fmt.Sprintf("epoch-%d", now.UnixNano())
	if err := a.store.NoteArchiveEpoch(ctx, epoch, now); err != nil {
		return err
	}
	if err := a.publish(ctx, map[string]string{events.MetaArchiveEpoch: epoch}); err != nil {
		return err
	}
	a.epoch.Store(&epoch)
	return nil
}

// start finds whether the table is the archive of the consumer's metadata before anything is
// consumed: a consumer that has archived nothing gets a first epoch; one whose table lost its
// marker fills the table again.
func (a *archiver) start(ctx context.Context, cons jetstream.Consumer) error {
	a.mu.Lock()
	defer a.mu.Unlock()
	info := cons.CachedInfo()
	if epoch := info.Config.Metadata[events.MetaArchiveEpoch]; epoch != "" {
		a.epoch.Store(&epoch)
		a.filled.Holds() // the first batch checks the marker (write)
		// Published again, so the runtime keeps it for a consumer it makes again after a loss:
		// one made without it would send every reader to the stream.
		if err := a.publish(ctx, map[string]string{events.MetaArchiveEpoch: epoch}); err != nil {
			a.log.WarnContext(ctx, "the archive's epoch could not be published again; the next refill publishes one", "epoch", epoch, "error", err)
		}
		return nil // the first batch checks the marker (write)
	}
	if info.AckFloor.Stream == 0 && info.NumAckPending == 0 {
		return retry.Do(ctx, retry.Redelivery(), func(try uint64, err error, _ time.Duration) {
			a.log.WarnContext(ctx, "the archive's first epoch could not be noted, will retry", "attempt", try, "error", err)
		}, func(ctx context.Context, _ uint64) error {
			if err := a.createDatabase(ctx); err != nil {
				return err
			}
			if _, err := a.store.Repair(ctx); err != nil {
				return err
			}
			if err := a.newEpoch(ctx); err != nil {
				return err
			}
			a.filled.Holds()
			return nil
		})
	}
	return a.refill(ctx, "the archiver's consumer names no epoch of the archive")
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
		a.checkIdle(ctx)
		if maxAge := a.promptsMaxAge(ctx); maxAge > 0 && age > maxAge/2 && time.Since(warned) > time.Minute {
			warned = time.Now()
			a.log.ErrorContext(ctx, "the archive lags more than half PROMPTS' retention: records may be trimmed from the stream before they are archived",
				"oldest_unarchived", age.Round(time.Second).String(), "prompts_max_age", maxAge.String())
		}
	})
}

// checkIdle finds a table that lost its marker while no record arrives (dropped, made again) and
// fills it again then, not at the next record: readers are sent to the stream meanwhile, which
// may no longer hold what the archive held.
func (a *archiver) checkIdle(ctx context.Context) {
	if a.epoch.Load() == nil || !a.mu.TryLock() {
		return // not started, or a batch is being written (it checks the table itself)
	}
	defer a.mu.Unlock()
	if err := a.whole(ctx); errors.Is(err, sink.ErrTableLost) {
		_ = a.refill(ctx, err.Error()) // ctx ended: the next start refills
	}
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
