package inputs

import (
	"strings"
	"sync"
	"time"

	"github.com/podium-llm/podium/internal/chstore"
)

// lineage is the store lineage (chstore.Lineage.ID) the ranker last published on its consumer, as
// the commit probes read it. A score snapshot serves only while it names this lineage; when it
// changes (a refill, a rebuild, the stream made again) the reads kept from before are dropped,
// since they may have been taken from a store that was not whole.
type lineage struct {
	mu        sync.Mutex
	current   string
	era       uint32         // of current's stream
	anchor    chstore.RowKey // current's anchor row; zero: none published
	refilling string         // why the ranker refills the store, as the last probe read it
	probed    time.Time      // when the probe that read it started
	changed   func()         // called, without mu, when current changes
}

// saw records the lineage a probe read, and whether the ranker refills the store; a lineage that
// names another stream than the one the probe saw (its creation time) is of a stream deleted
// since, and counts as none. era is its stream's era; at is when the probe started.
func (l *lineage) saw(id, refilling string, era uint32, anchor chstore.RowKey, streamCreated, at time.Time) {
	if _, stream, ok := strings.Cut(id, "@"); !ok || stream != chstore.StreamID(streamCreated) {
		id, era, anchor = "", 0, chstore.RowKey{} // of no stream there is now
	}
	l.mu.Lock()
	if at.Before(l.probed) { // an older probe than the one read last says nothing new
		l.mu.Unlock()
		return
	}
	moved := id != l.current
	l.current, l.era, l.anchor, l.refilling, l.probed = id, era, anchor, refilling, at
	l.mu.Unlock()
	if moved && l.changed != nil {
		l.changed()
	}
}

// serves reports whether something derived from lineage id may be served now, and the era of
// its stream.
func (l *lineage) serves(id string) (uint32, bool) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.era, id != "" && id == l.current
}

// eraNow is the era of the stream of the lineage, as the last probe read it.
func (l *lineage) eraNow() uint32 {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.era
}

// anchored is the anchor row of the lineage, as the last probe read it; false when none.
func (l *lineage) anchored() (chstore.RowKey, bool) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.anchor, l.current != "" && l.anchor != (chstore.RowKey{})
}

// refill says why the ranker refills the store, as the last probe read it; empty when it does not.
func (l *lineage) refill() string {
	why, _ := l.refillSince()
	return why
}

// refillSince is refill, and when the probe that read it started.
func (l *lineage) refillSince() (string, time.Time) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.refilling, l.probed
}
