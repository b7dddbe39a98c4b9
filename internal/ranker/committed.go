package ranker

import (
	"encoding/json"

	"github.com/podium-llm/podium/pkg/events"
)

// notifyCommitted tells composers that a batch is committed (events.SubjectCommitted), so a
// request waiting for it is answered at once rather than at its next poll of the ack floor. The
// notice is best effort: nothing waits on it alone.
func (r *ranker) notifyCommitted(b batch) {
	if r.nc == nil || len(b.keep) == 0 {
		return
	}
	var top uint64
	for _, rec := range b.recs {
		top = max(top, rec.Seq)
	}
	body, _ := json.Marshal(events.Committed{EvaluationsSeq: top})
	if err := r.nc.Publish(events.SubjectCommitted, body); err != nil {
		r.log.Debug("commit notice not sent", "error", err)
	}
}
