// Package streamscan reads what a stream holds on a subject filter, oldest first, once: the
// audit records of the CLI and the console, and the console's catch-up of requests and answers.
// One message is in hand at a time, so what a reader keeps is its own choice, not the stream's
// size.
package streamscan

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/nats-io/nats.go/jetstream"
)

// fetchMax is the most messages one fetch asks for; the client's buffer bounds its bytes.
const fetchMax = 256

// Scan hands fn every message of stream on filter after sequence after (0: from the first),
// oldest first, up to what the stream held when the scan began; fn's error stops it. It returns
// how many messages fn saw. A missing stream is jetstream.ErrStreamNotFound, wrapped.
func Scan(ctx context.Context, js jetstream.JetStream, stream, filter string, after uint64, fn func(jetstream.Msg) error) (int, error) {
	cfg := jetstream.OrderedConsumerConfig{FilterSubjects: []string{filter}}
	if after > 0 {
		cfg.DeliverPolicy, cfg.OptStartSeq = jetstream.DeliverByStartSequencePolicy, after+1
	}
	cons, err := js.OrderedConsumer(ctx, stream, cfg)
	if err != nil {
		return 0, fmt.Errorf("read %s: %w", stream, err)
	}
	info, err := cons.Info(ctx)
	if err != nil {
		return 0, fmt.Errorf("read %s: %w", stream, err)
	}
	read := 0
	for pending := info.NumPending; pending > 0; {
		batch, err := cons.Fetch(int(min(pending, fetchMax)), jetstream.FetchMaxWait(5*time.Second))
		if err != nil {
			return read, fmt.Errorf("read %s: %w", stream, err)
		}
		n := 0
		for msg := range batch.Messages() {
			n++
			if err := fn(msg); err != nil {
				return read + n, err
			}
		}
		// A fetch that failed part way says so here: what was read is not the whole.
		if err := batch.Error(); err != nil && !errors.Is(err, jetstream.ErrNoMessages) {
			return read + n, fmt.Errorf("read %s: %w", stream, err)
		}
		if n == 0 {
			break
		}
		read += n
		pending -= min(uint64(n), pending)
	}
	return read, nil
}
