package streamscan

import (
	"context"
	"errors"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
)

// errRead is every acknowledgement of a message a scan read: it was read from the stream, not
// delivered by a consumer, so there is nothing to acknowledge.
var errRead = errors.New("streamscan: a message read from a stream, not delivered by a consumer, cannot be acknowledged")

// stored is a message as a scan read it: a jetstream.Msg, so the code that reads a delivered
// message (a service's handler) reads a scanned one the same way.
type stored struct {
	stream  string
	subject string
	seq     uint64
	at      time.Time
	pending uint64
	header  nats.Header
	data    []byte
}

func (m *stored) Metadata() (*jetstream.MsgMetadata, error) {
	return &jetstream.MsgMetadata{Sequence: jetstream.SequencePair{Stream: m.seq}, NumPending: m.pending,
		Timestamp: m.at, Stream: m.stream}, nil
}
func (m *stored) Data() []byte                     { return m.data }
func (m *stored) Headers() nats.Header             { return m.header }
func (m *stored) Subject() string                  { return m.subject }
func (m *stored) Reply() string                    { return "" }
func (m *stored) Ack() error                       { return errRead }
func (m *stored) DoubleAck(context.Context) error  { return errRead }
func (m *stored) Nak() error                       { return errRead }
func (m *stored) NakWithDelay(time.Duration) error { return errRead }
func (m *stored) InProgress() error                { return errRead }
func (m *stored) Term() error                      { return errRead }
func (m *stored) TermWithReason(string) error      { return errRead }
