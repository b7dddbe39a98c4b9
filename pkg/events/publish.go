package events

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
)

// Headers of a dead letter.
const (
	HeaderDeadReason   = "Dead-Reason"
	HeaderDeadStream   = "Dead-Stream"
	HeaderDeadSequence = "Dead-Sequence"
)

// maxReasonLen keeps a Dead-Reason header readable and far below the header limit.
const maxReasonLen = 2048

// Marshal builds a structured-mode CloudEvent around data. Times are written in UTC with
// microsecond precision, the precision the whole pipeline compares at.
func Marshal(id, source, eventType string, t time.Time, data any) ([]byte, error) {
	// Data as a value: encoded in one pass, not encoded and then compacted again as a
	// json.RawMessage would be (a prompt.composed body is several KiB).
	env := envelope[any]{
		SpecVersion:     SpecVersion,
		ID:              id,
		Source:          source,
		Type:            eventType,
		Time:            t.UTC().Truncate(time.Microsecond).Format(time.RFC3339Nano),
		DataContentType: "application/json",
		Data:            data,
	}
	b, err := json.Marshal(env)
	if err != nil {
		return nil, fmt.Errorf("events: marshal %s data: %w", eventType, err)
	}
	return b, nil
}

// DerivedID is a stable event id computed from parts alone, so that whichever replica produces
// the event, and however often, the broker's duplicate window sees the same Nats-Msg-Id.
func DerivedID(kind string, parts ...string) string {
	h := sha256.New()
	for _, p := range parts {
		h.Write([]byte(p))
		h.Write([]byte{0})
	}
	return kind + "-" + hex.EncodeToString(h.Sum(nil))[:40]
}

// PromptEventID is the id of the one prompt.composed or prompt.failed that answers a request.
func PromptEventID(requestID string) string { return DerivedID("prompt", requestID) }

// Publish sends a CloudEvent body with its id as Nats-Msg-Id, so retries are deduplicated by the
// stream, and waits for the stream's acknowledgement.
func Publish(ctx context.Context, js jetstream.JetStream, subject, id string, body []byte) (*jetstream.PubAck, error) {
	msg := nats.NewMsg(subject)
	msg.Data = body
	msg.Header.Set("Content-Type", ContentType)
	msg.Header.Set(nats.MsgIdHdr, id)
	ack, err := js.PublishMsg(ctx, msg)
	if err != nil {
		return nil, fmt.Errorf("events: publish %s: %w", subject, err)
	}
	return ack, nil
}

// DeadLetter copies msg byte for byte to deadletter.<subject> with the reason and its origin.
// Its id derives from the origin, so a redelivered poison message is stored once. The caller
// terminates msg after this returns nil.
func DeadLetter(ctx context.Context, js jetstream.JetStream, msg jetstream.Msg, reason string) error {
	md, err := msg.Metadata()
	if err != nil {
		return fmt.Errorf("events: dead letter: %w", err)
	}
	dl := nats.NewMsg(DeadLetterSubject(msg.Subject()))
	dl.Data = msg.Data()
	for k, vs := range msg.Headers() {
		if k == nats.MsgIdHdr {
			continue // the original id would collide with the original message in the window
		}
		for _, v := range vs {
			dl.Header.Add(k, v)
		}
	}
	dl.Header.Set(HeaderDeadReason, headerSafe(reason))
	dl.Header.Set(HeaderDeadStream, md.Stream)
	dl.Header.Set(HeaderDeadSequence, strconv.FormatUint(md.Sequence.Stream, 10))
	dl.Header.Set(nats.MsgIdHdr, DerivedID("dead", md.Stream, strconv.FormatUint(md.Sequence.Stream, 10)))
	if _, err := js.PublishMsg(ctx, dl); err != nil {
		return fmt.Errorf("events: dead letter %s: %w", msg.Subject(), err)
	}
	return nil
}

// headerSafe folds a message into one header line of bounded length.
func headerSafe(s string) string {
	s = strings.Map(func(r rune) rune {
		if r == '\r' || r == '\n' || r < 0x20 && r != '\t' {
			return ' '
		}
		return r
	}, s)
	if len(s) > maxReasonLen {
		s = strings.ToValidUTF8(s[:maxReasonLen], "") + "…"
	}
	return s
}
