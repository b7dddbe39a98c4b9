// Package door decides who may call the HTTP endpoints that serve tournament data: submissions,
// feedback and prompts (the console's pages, the ranker's leaderboards and histories, the
// composer's renders). One rule for all of them:
//   - with a credential configured (a bearer token, also taken as the password of HTTP basic auth
//     so a browser can send it, or a basic-auth pair), every request must carry it;
//   - without one, a service bound to loopback answers only requests that name a loopback host,
//     so a web page whose DNS name is rebound to 127.0.0.1 cannot read it through the browser of
//     someone who runs Podium on their machine;
//   - without one, a service bound anywhere else refuses them (the console refuses to start).
//
// The probes (/healthz, /readyz) and /metrics stay open: they say nothing of any tournament, and
// orchestrators and Prometheus call them without credentials.
package door

import (
	"crypto/sha256"
	"crypto/subtle"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"strings"
)

// Door is a service's credential; the zero value has none.
type Door struct {
	Token              string
	BasicUser, BasicPW string
	// TokenVar names the setting of the token, for the messages (CONSOLE_AUTH_TOKEN,
	// RANKER_API_TOKEN).
	TokenVar string
}

func (d Door) configured() bool { return d.Token != "" || d.BasicUser != "" }

// Validate checks that a basic-auth pair is whole.
func (d Door) Validate() error {
	if (d.BasicUser == "") != (d.BasicPW == "") {
		return errors.New("a basic-auth user and password are set together or not at all")
	}
	return nil
}

// Loopback reports whether addr (host:port) listens on loopback only. An empty host, an
// unspecified address and any name but localhost listen (or may listen) elsewhere.
func Loopback(addr string) bool {
	host, _, err := net.SplitHostPort(addr)
	if err != nil {
		return false
	}
	return loopbackHost(host)
}

func loopbackHost(host string) bool {
	if host == "localhost" {
		return true
	}
	ip := net.ParseIP(strings.Trim(host, "[]"))
	return ip != nil && ip.IsLoopback()
}

// CheckBind refuses to serve a non-loopback address without a credential (the console: it
// serves nothing else).
func (d Door) CheckBind(addr string) error {
	if Loopback(addr) || d.configured() {
		return nil
	}
	return fmt.Errorf("%s is not a loopback address: set %s (or a basic-auth pair) to serve it, or bind 127.0.0.1", addr, d.TokenVar)
}

// open are the paths every caller may reach.
func open(path string) bool { return path == "/healthz" || path == "/readyz" || path == "/metrics" }

// Guard wraps the handler of a service listening on addr (see the package comment).
func (d Door) Guard(addr string) func(http.Handler) http.Handler {
	loopback := Loopback(addr)
	return func(next http.Handler) http.Handler {
		return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			switch {
			case open(r.URL.Path):
			case d.configured():
				if !d.allows(r) {
					w.Header().Set("WWW-Authenticate", `Basic realm="podium", charset="UTF-8"`)
					refuse(w, http.StatusUnauthorized, "unauthorized", "this endpoint needs the token of "+d.TokenVar+" (Authorization: Bearer, or as the basic-auth password)")
					return
				}
			case !loopback:
				refuse(w, http.StatusForbidden, "forbidden", "this endpoint serves tournament data and the service listens beyond loopback without a credential: set "+d.TokenVar)
				return
			case !loopbackRequest(r):
				refuse(w, http.StatusForbidden, "forbidden", "this service listens on loopback and answers requests to a loopback host only (localhost, 127.0.0.1, [::1])")
				return
			}
			next.ServeHTTP(w, r)
		})
	}
}

// refuse answers a refused request with the contract's error body, {"code", "message"}.
func refuse(w http.ResponseWriter, status int, code, message string) {
	body, _ := json.Marshal(map[string]string{"code": code, "message": message})
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("X-Content-Type-Options", "nosniff")
	w.WriteHeader(status)
	_, _ = w.Write(append(body, '\n'))
}

// loopbackRequest reports whether the request names a loopback host.
func loopbackRequest(r *http.Request) bool {
	host := r.Host
	if h, _, err := net.SplitHostPort(host); err == nil {
		host = h
	}
	return loopbackHost(host)
}

func (d Door) allows(r *http.Request) bool {
	if tok, ok := strings.CutPrefix(r.Header.Get("Authorization"), "Bearer "); ok && d.Token != "" {
		return same(tok, d.Token)
	}
	user, pw, ok := r.BasicAuth()
	if !ok {
		return false
	}
	if d.Token != "" && same(pw, d.Token) {
		return true
	}
	return d.BasicUser != "" && same(user, d.BasicUser) && same(pw, d.BasicPW)
}

// same compares in constant time, whatever the lengths (hashes first).
func same(a, b string) bool {
	ha, hb := sha256.Sum256([]byte(a)), sha256.Sum256([]byte(b))
	return subtle.ConstantTimeCompare(ha[:], hb[:]) == 1
}

// API guards a service's API on addr with token, named tokenVar in the messages; what names the
// endpoints, for the warning a bind beyond loopback without a token gets (they then answer 403).
func API(log *slog.Logger, addr, token, tokenVar, what string) func(http.Handler) http.Handler {
	d := Door{Token: token, TokenVar: tokenVar}
	if token == "" && !Loopback(addr) {
		log.Warn("HTTP_ADDR is beyond loopback and "+tokenVar+" is not set: "+what+" answer 403 (probes and metrics are open)", "http_addr", addr)
	}
	return d.Guard(addr)
}
