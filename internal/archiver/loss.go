package archiver

import (
	"context"
	"fmt"

	"github.com/nats-io/nats.go"

	"github.com/podium-llm/podium/internal/chstore"
	"github.com/podium-llm/podium/internal/sink"
	"github.com/podium-llm/podium/pkg/events"
)

// A loss of the archive is named as the ranker's store's is (internal/sink/loss.go): the archive
// holds the records of every era since its lineage's floor, but PROMPTS holds only its own stream's;
// when the table is lost while it held records of a PROMPTS deleted since, those records exist
// nowhere else, and a refill from the stream there is now would call a shorter archive whole. The
// keeper names the loss instead (unready, nothing archived, readers reading the stream alone) until
// an operator accepts it (`podium store accept-loss --archive`, recorded on AUDIT as
// events.SubjectArchiveLossAccepted) or restores PROMPTS. The audit log's checkpoints, where a key
// signs them, still prove which positions the lost records held.

// losses is the archiver's sink.Losses.
type losses struct{ nc *nats.Conn }

// Of names the eras lost. It names no execution: the records that would say which were only in
// the table lost.
func (losses) Of(_ context.Context, lin chstore.Lineage, stream string) (*events.StoreLoss, error) {
	from, to, lost := lin.LostEras(stream)
	if !lost {
		return nil, nil
	}
	return &events.StoreLoss{Lineage: lin.ID(), FromEra: from, ToEra: to, Executions: []string{}}, nil
}

func (l losses) Accepted(ctx context.Context, lineage string) (bool, error) {
	return sink.AcceptedOn(ctx, l.nc, events.SubjectArchiveLossAccepted, lineage)
}

func (losses) Text(l events.StoreLoss) string {
	return fmt.Sprintf("prompt records lost: the prompts archive (lineage %s) lost its table while it held the records of %s, whose PROMPTS streams were deleted; accept it with `podium store accept-loss --archive --lineage %s`, or restore PROMPTS",
		l.Lineage, sink.ErasText(l), l.Lineage)
}
