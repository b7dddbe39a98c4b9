package sink

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strconv"
	"strings"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/podium-llm/podium/internal/chstore"
	"github.com/podium-llm/podium/pkg/events"
)

// Keys are the metadata keys under which a service's consumer carries its keeper's State
// (events.MetaStore* for the ranker's store, events.MetaArchive* for the prompts archive): one
// codec, so that readers of either view read the same fields the same way.
type Keys struct {
	Lineage, Era, Floor, Anchor, Refilling, Loss string
}

// StoreKeys and ArchiveKeys are the ranker's and the archiver's.
var (
	StoreKeys = Keys{Lineage: events.MetaStoreLineage, Era: events.MetaStoreEra, Floor: events.MetaStoreFloor,
		Anchor: events.MetaStoreAnchor, Refilling: events.MetaStoreRefilling, Loss: events.MetaStoreLoss}
	ArchiveKeys = Keys{Lineage: events.MetaArchiveLineage, Era: events.MetaArchiveEra, Floor: events.MetaArchiveFloor,
		Anchor: events.MetaArchiveAnchor, Refilling: events.MetaArchiveRefilling, Loss: events.MetaArchiveLoss}
)

// Metadata is s as the consumer's metadata: the lineage's ID, era and floor, its anchor (absent
// while the table held none), why a refill runs (absent: none) and the loss waited on (absent:
// none).
func (k Keys) Metadata(s State) (map[string]string, error) {
	lin := s.Lineage
	md := map[string]string{k.Lineage: lin.ID(), k.Era: strconv.FormatUint(uint64(lin.Era), 10), k.Floor: strconv.FormatUint(uint64(lin.Floor), 10)}
	if lin.Anchor != (chstore.RowKey{}) {
		md[k.Anchor] = lin.Anchor.String()
	}
	if s.Refilling != "" {
		md[k.Refilling] = s.Refilling
	}
	if s.Loss != nil {
		b, err := json.Marshal(s.Loss)
		if err != nil {
			return nil, err
		}
		md[k.Loss] = string(b)
	}
	return md, nil
}

// ParseLineageID reads a lineage's ID (chstore.Lineage.ID: epoch@stream); false when it is not one.
func ParseLineageID(id string) (chstore.Lineage, bool) {
	epochText, stream, ok := strings.Cut(id, "@")
	epoch, err := strconv.ParseUint(epochText, 10, 64)
	if !ok || err != nil || epoch == 0 {
		return chstore.Lineage{}, false
	}
	return chstore.Lineage{Epoch: epoch, Stream: stream}, true
}

// LineageOf reads the lineage a consumer's metadata names (epoch, stream, era, floor and anchor),
// taken as whole; false when it names none, or names one it does not say whole (an era or an
// anchor that does not read: taken as 0 or none, it could lower an era or hide a loss). An era
// absent is 0 (a service before eras), a floor absent 0 (before floors: every era since the first
// counts as held).
func (k Keys) LineageOf(md map[string]string) (chstore.Lineage, bool) {
	lin, ok := ParseLineageID(md[k.Lineage])
	if !ok {
		return chstore.Lineage{}, false
	}
	lin.Whole = true
	if s := md[k.Era]; s != "" {
		era, err := strconv.ParseUint(s, 10, 32)
		if err != nil {
			return chstore.Lineage{}, false
		}
		lin.Era = uint32(era)
	}
	if floor, err := strconv.ParseUint(md[k.Floor], 10, 32); err == nil {
		lin.Floor = uint32(floor)
	}
	if a := md[k.Anchor]; a != "" {
		anchor, err := chstore.ParseRowKey(a)
		if err != nil {
			return chstore.Lineage{}, false
		}
		lin.Anchor = anchor
	}
	return lin, true
}

// consumerLineage is the lineage the service's durable consumer carries (Config.Keys,
// Config.Consumer); false when it (or the stream) is not there, or names none.
func (k *Keeper[R]) consumerLineage(ctx context.Context) (chstore.Lineage, bool, error) {
	if k.cfg.Consumer == "" {
		return chstore.Lineage{}, false, nil
	}
	cons, err := k.cfg.JS.Consumer(ctx, k.cfg.View.Stream, k.cfg.Consumer)
	if errors.Is(err, jetstream.ErrConsumerNotFound) || errors.Is(err, jetstream.ErrStreamNotFound) {
		return chstore.Lineage{}, false, nil
	}
	if err != nil {
		return chstore.Lineage{}, false, fmt.Errorf("the consumer %s of %s: %w", k.cfg.Consumer, k.cfg.View.Stream, err)
	}
	lin, ok := k.cfg.Keys.LineageOf(cons.CachedInfo().Config.Metadata)
	return lin, ok, nil
}
