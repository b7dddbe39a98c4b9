package service

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"net/http"
	"net/http/pprof"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"
)

// Server is the HTTP side of a service: its API plus /metrics, /healthz and /readyz.
type Server struct {
	srv *http.Server
	ln  net.Listener
}

// HTTP is how a service's HTTP server treats clients, and whether it serves profiles.
type HTTP struct {
	Pprof            bool          `envconfig:"PPROF" default:"false" desc:"serve Go profiles under /debug/pprof/ on the HTTP address (off: they expose internals)"`
	HTTPReadTimeout  time.Duration `envconfig:"HTTP_READ_TIMEOUT" default:"15s" desc:"longest time to read one HTTP request, body included (slow clients are cut off)"`
	HTTPWriteTimeout time.Duration `envconfig:"HTTP_WRITE_TIMEOUT" default:"60s" desc:"longest time to answer one HTTP request (a render waits for inputs, then renders)"`
	HTTPIdleTimeout  time.Duration `envconfig:"HTTP_IDLE_TIMEOUT" default:"60s" desc:"how long an idle keep-alive HTTP connection stays open"`
}

// Validate checks the timeouts; prefix is the service's, for the messages.
func (c *HTTP) Validate(prefix string) error {
	var errs []error
	for _, d := range []struct {
		name string
		v    time.Duration
	}{{"HTTP_READ_TIMEOUT", c.HTTPReadTimeout}, {"HTTP_WRITE_TIMEOUT", c.HTTPWriteTimeout}, {"HTTP_IDLE_TIMEOUT", c.HTTPIdleTimeout}} {
		if d.v <= 0 {
			errs = append(errs, fmt.Errorf("%s must be positive, got %s", variable(d.name, prefix), d.v))
		}
	}
	return errors.Join(errs...)
}

// HTTPLimits are the bounds every HTTP server of a service applies.
func (c *HTTP) HTTPLimits() HTTPLimits {
	return HTTPLimits{Read: c.HTTPReadTimeout, Write: c.HTTPWriteTimeout, Idle: c.HTTPIdleTimeout}
}

// HTTPLimits bound what one client can hold of a server.
type HTTPLimits struct {
	Read, Write, Idle time.Duration
}

// MaxHeaderBytes bounds a request's line and headers: a longer one is answered 431.
const MaxHeaderBytes = 64 << 10

// Listen binds addr and builds the handler; ready answers /readyz (health.Health's handler).
//
// Requests' contexts derive from base, so handlers stop when the service abandons its work.
func Listen(base context.Context, addr string, lim HTTPLimits, api http.Handler, gatherer prometheus.Gatherer, ready http.Handler, pprofOn bool) (*Server, error) {
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return nil, fmt.Errorf("listen %s: %w", addr, err)
	}
	mux := http.NewServeMux()
	// OpenMetrics when the scraper asks for it: only that format carries exemplars (trace ids).
	mux.Handle("GET /metrics", promhttp.HandlerFor(gatherer, promhttp.HandlerOpts{EnableOpenMetrics: true}))
	mux.HandleFunc("GET /healthz", func(w http.ResponseWriter, _ *http.Request) {
		WriteJSON(w, http.StatusOK, map[string]string{"status": "ok"})
	})
	mux.Handle("GET /readyz", ready)
	if pprofOn {
		mux.HandleFunc("GET /debug/pprof/", pprof.Index)
		mux.HandleFunc("GET /debug/pprof/profile", pprof.Profile)
		mux.HandleFunc("GET /debug/pprof/trace", pprof.Trace)
	}
	if api != nil {
		mux.Handle("/", api)
	}
	srv := &http.Server{Handler: mux, ReadHeaderTimeout: min(5*time.Second, lim.Read), ReadTimeout: lim.Read,
		WriteTimeout: lim.Write, IdleTimeout: lim.Idle, MaxHeaderBytes: MaxHeaderBytes,
		BaseContext: func(net.Listener) context.Context { return base }}
	return &Server{srv: srv, ln: ln}, nil
}

// Guard wraps every endpoint of the server, the probes and /metrics included, in mw (an
// authentication check); call it before Serve.
func (s *Server) Guard(mw func(http.Handler) http.Handler) { s.srv.Handler = mw(s.srv.Handler) }

// Addr is the bound address (useful with port 0).
func (s *Server) Addr() string { return s.ln.Addr().String() }

// Serve blocks until Shutdown.
func (s *Server) Serve() error {
	if err := s.srv.Serve(s.ln); !errors.Is(err, http.ErrServerClosed) {
		return fmt.Errorf("http: %w", err)
	}
	return nil
}

// Shutdown stops accepting requests and waits for the ones in flight.
func (s *Server) Shutdown(ctx context.Context) error { return s.srv.Shutdown(ctx) }

// WriteJSON writes v with status.
func WriteJSON(w http.ResponseWriter, status int, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	_, _ = w.Write(EncodeJSON(v))
}

// EncodeJSON is the encoding of every JSON answer, over HTTP and NATS alike: prompts carry <, >
// and &, which are not escaped; a newline ends it.
func EncodeJSON(v any) []byte {
	var b bytes.Buffer
	enc := json.NewEncoder(&b)
	enc.SetEscapeHTML(false)
	if err := enc.Encode(v); err != nil {
		return []byte(`{"code":"internal","message":"` + err.Error() + `"}` + "\n")
	}
	return b.Bytes()
}

// Error is the JSON body of every 4xx and 5xx of the APIs.
type Error struct {
	Code    string `json:"code"`
	Message string `json:"message"`
}
