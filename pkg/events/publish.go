package events

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
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
	// HeaderDeadTruncated holds the original body's size when the dead letter carries only its
	// head: the original stays addressable by Dead-Stream and Dead-Sequence.
	HeaderDeadTruncated = "Dead-Truncated"
)

// MaxReasonBytes bounds a Dead-Reason header (docs/contract.md#dead-letters: at most 512 bytes).
const MaxReasonBytes = 512

// TooLargeError says a message would exceed the largest message the server takes.
type TooLargeError struct {
	Subject     string
	Size, Limit int64 // body plus headers, and the server's max payload
}

func (e *TooLargeError) Error() string {
	return fmt.Sprintf("the %s message would be %d bytes, over the server's max payload of %d bytes", e.Subject, e.Size, e.Limit)
}

// messageSize is what the server counts against its max payload: the body and the headers as
// the client encodes them ("NATS/1.0\r\n", one "Key: value\r\n" per value, "\r\n").
func messageSize(msg *nats.Msg) int64 {
	n := len(msg.Data)
	if len(msg.Header) > 0 {
		n += len("NATS/1.0\r\n\r\n")
		for k, vs := range msg.Header {
			for _, v := range vs {
				n += len(k) + len(": ") + len(v) + len("\r\n")
			}
		}
	}
	return int64(n)
}

// checkSize refuses a message the server would refuse, before it is sent: the caller can then
// answer with a failure instead of retrying what can never succeed.
func checkSize(js jetstream.JetStream, msg *nats.Msg) error {
	limit := js.Conn().MaxPayload()
	if size := messageSize(msg); limit > 0 && size > limit {
		return &TooLargeError{Subject: msg.Subject, Size: size, Limit: limit}
	}
	return nil
}

// Marshal builds a structured-mode CloudEvent around data. Times are written in UTC with
// microsecond precision, the precision the whole pipeline compares at.
func Marshal(id, source, eventType string, t time.Time, data any) ([]byte, error) {
	return MarshalTraced(id, source, eventType, t, data, TraceContext{})
}

// MarshalTraced is Marshal with the trace context of the span that produced the event.
func MarshalTraced(id, source, eventType string, t time.Time, data any, tc TraceContext) ([]byte, error) {
	// Data as a value: encoded in one pass, not encoded and then compacted again as a
	// json.RawMessage would be (a prompt.composed body is several KiB).
	env := envelope[any]{
		SpecVersion:     SpecVersion,
		ID:              id,
		Source:          source,
		Type:            eventType,
		Time:            t.UTC().Truncate(time.Microsecond).Format(time.RFC3339Nano),
		DataContentType: "application/json",
		TraceParent:     tc.Parent,
		TraceState:      tc.State,
		Data:            data,
	}
	// Without HTML escaping: a prompt's "<" and "&" are written as themselves, as the render API
	// writes them, so an event and a render of the same prompt hold the same bytes for it.
	var buf bytes.Buffer
	enc := json.NewEncoder(&buf)
	enc.SetEscapeHTML(false)
	if err := enc.Encode(env); err != nil {
		return nil, fmt.Errorf("events: marshal %s data: %w", eventType, err)
	}
	return bytes.TrimSuffix(buf.Bytes(), []byte("\n")), nil
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
// stream, and waits for the stream's acknowledgement. A message over the server's max payload
// is refused with a *TooLargeError without being sent.
func Publish(ctx context.Context, js jetstream.JetStream, subject, id string, body []byte) (*jetstream.PubAck, error) {
	return PublishTraced(ctx, js, subject, id, body, TraceContext{})
}

// PublishTraced is Publish with trace context in the headers too (the body carries it already).
func PublishTraced(ctx context.Context, js jetstream.JetStream, subject, id string, body []byte, tc TraceContext) (*jetstream.PubAck, error) {
	msg := eventMsg(subject, id, body, tc)
	if err := checkSize(js, msg); err != nil {
		return nil, err
	}
	ack, err := js.PublishMsg(ctx, msg)
	if err != nil {
		return nil, fmt.Errorf("events: publish %s: %w", subject, err)
	}
	return ack, nil
}

// eventMsg is the message PublishTraced sends.
func eventMsg(subject, id string, body []byte, tc TraceContext) *nats.Msg {
	msg := nats.NewMsg(subject)
	msg.Data = body
	msg.Header.Set("Content-Type", ContentType)
	msg.Header.Set(nats.MsgIdHdr, id)
	if tc.Parent != "" {
		msg.Header[HeaderTraceParent] = []string{tc.Parent}
		if tc.State != "" {
			msg.Header[HeaderTraceState] = []string{tc.State}
		}
	}
	return msg
}

// Fits is nil when PublishTraced would send the event, a *TooLargeError when the server would
// refuse it as too large.
func Fits(js jetstream.JetStream, subject, id string, body []byte, tc TraceContext) error {
	return checkSize(js, eventMsg(subject, id, body, tc))
}

// DeadLetter copies msg byte for byte to deadletter.<subject> with the reason and its origin.
// Its id derives from the origin, so a redelivered poison message is stored once. A dead letter
// always fits: the reason is cut to MaxReasonBytes, and a body that would not fit beside the
// headers in the server's max payload is cut to fit and marked Dead-Truncated. The caller
// terminates msg after this returns nil.
func DeadLetter(ctx context.Context, js jetstream.JetStream, msg jetstream.Msg, reason string) error {
	md, err := msg.Metadata()
	if err != nil {
		return fmt.Errorf("events: dead letter: %w", err)
	}
	dl := nats.NewMsg(DeadLetterSubject(msg.Subject()))
	dl.Data = msg.Data()
	for k, vs := range msg.Headers() {
		// Not the original's Nats- headers: its Nats-Msg-Id would collide with the original in the
		// duplicate window, and expectations (Nats-Expected-Stream, ...) would refuse the copy. Not
		// keys the client cannot send either: the dead letter would fail every time.
		if strings.HasPrefix(strings.ToLower(k), "nats-") || !validHeaderKey(k) {
			continue
		}
		for _, v := range vs {
			dl.Header.Add(k, headerSafe(v))
		}
	}
	dl.Header.Set(HeaderDeadReason, headerSafe(reason))
	dl.Header.Set(HeaderDeadStream, md.Stream)
	dl.Header.Set(HeaderDeadSequence, strconv.FormatUint(md.Sequence.Stream, 10))
	dl.Header.Set(nats.MsgIdHdr, DerivedID("dead", md.Stream, strconv.FormatUint(md.Sequence.Stream, 10)))
	limit := js.Conn().MaxPayload()
	if limit > 0 && messageSize(dl)-int64(len(dl.Data)) > limit/2 {
		// The original's headers alone would crowd the body out: keep the dead letter's own.
		for k := range dl.Header {
			if !strings.HasPrefix(k, "Dead-") && k != nats.MsgIdHdr {
				dl.Header.Del(k)
			}
		}
	}
	if limit > 0 && messageSize(dl) > limit {
		original := len(dl.Data)
		dl.Header.Set(HeaderDeadTruncated, strconv.Itoa(original))
		keep := max(limit-(messageSize(dl)-int64(original)), 0)
		dl.Data = dl.Data[:keep]
	}
	if _, err := js.PublishMsg(ctx, dl); err != nil {
		return fmt.Errorf("events: dead letter %s: %w", msg.Subject(), err)
	}
	return nil
}

// validHeaderKey reports whether the client can send k as a header key: printable ASCII
// without spaces or colons.
func validHeaderKey(k string) bool {
	for i := 0; i < len(k); i++ {
		if c := k[i]; c <= ' ' || c >= 0x7f || c == ':' {
			return false
		}
	}
	return k != ""
}

// headerSafe folds a message into one header line of at most MaxReasonBytes bytes.
func headerSafe(s string) string {
	s = strings.Map(func(r rune) rune {
		if r == '\r' || r == '\n' || r < 0x20 && r != '\t' {
			return ' '
		}
		return r
	}, s)
	if len(s) > MaxReasonBytes {
		s = strings.ToValidUTF8(s[:MaxReasonBytes-len("…")], "") + "…"
	}
	return s
}

// codeInsufficientResources is JetStream's error code for a store that has no room left (the
// server's or the account's storage limit).
const codeInsufficientResources = 10023

// StorageFull reports whether a publish was refused because JetStream's storage is full: the
// message was not stored, and the same publish succeeds once space is freed or limits raised.
func StorageFull(err error) bool {
	var api *jetstream.APIError
	return errors.As(err, &api) && api.ErrorCode == codeInsufficientResources
}
