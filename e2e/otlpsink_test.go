package e2e

import (
	"bytes"
	"compress/gzip"
	"io"
	"net"
	"net/http"
	"sync"
	"testing"

	coltrace "go.opentelemetry.io/proto/otlp/collector/trace/v1"
	"google.golang.org/protobuf/proto"
)

// otlpSink is a real OTLP/HTTP receiver for benchmarks: it decodes every export request with the
// official OTLP types and counts the spans, so a benchmark of tracing pays for a receiver's answer
// as it would with a collector, and says how much was exported.
type otlpSink struct {
	addr string

	mu              sync.Mutex
	spans, requests int
}

func startOTLPSink(tb testing.TB) *otlpSink {
	tb.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		tb.Fatal(err)
	}
	s := &otlpSink{addr: l.Addr().String()}
	srv := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		var body io.Reader = r.Body
		if r.Header.Get("Content-Encoding") == "gzip" {
			zr, err := gzip.NewReader(r.Body)
			if err != nil {
				http.Error(w, err.Error(), http.StatusBadRequest)
				return
			}
			body = zr
		}
		raw, err := io.ReadAll(body)
		var req coltrace.ExportTraceServiceRequest
		if err == nil {
			err = proto.Unmarshal(raw, &req)
		}
		if err != nil {
			http.Error(w, err.Error(), http.StatusBadRequest)
			return
		}
		n := 0
		for _, rs := range req.ResourceSpans {
			for _, ss := range rs.ScopeSpans {
				n += len(ss.Spans)
			}
		}
		s.mu.Lock()
		s.spans += n
		s.requests++
		s.mu.Unlock()
		resp, _ := proto.Marshal(&coltrace.ExportTraceServiceResponse{})
		w.Header().Set("Content-Type", "application/x-protobuf")
		_, _ = io.Copy(w, bytes.NewReader(resp))
	})}
	go srv.Serve(l)
	tb.Cleanup(func() { srv.Close() })
	return s
}

func (s *otlpSink) counts() (spans, requests int) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.spans, s.requests
}
