package console

import (
	"crypto/sha256"
	"crypto/subtle"
	"errors"
	"fmt"
	"net"
	"net/http"
	"strings"
)

// Auth is who may read the console: nobody needs a credential on a loopback address; anywhere
// else a bearer token (also accepted as the password of HTTP basic auth, so a browser can send
// it) or a basic-auth pair is required on every request but the probes.
type Auth struct {
	Token              string
	BasicUser, BasicPW string
}

func (a Auth) configured() bool { return a.Token != "" || a.BasicUser != "" }

// Validate checks that a basic-auth pair is whole.
func (a Auth) Validate() error {
	if (a.BasicUser == "") != (a.BasicPW == "") {
		return errors.New("CONSOLE_BASIC_USER and CONSOLE_BASIC_PASSWORD are set together or not at all")
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
	if host == "localhost" {
		return true
	}
	ip := net.ParseIP(host)
	return ip != nil && ip.IsLoopback()
}

// CheckBind refuses to serve a non-loopback address without a credential: the console shows
// every prompt and submission, which are not for anyone who can reach the port.
func CheckBind(addr string, a Auth) error {
	if Loopback(addr) || a.configured() {
		return nil
	}
	return fmt.Errorf("CONSOLE_ADDR %s is not a loopback address: set CONSOLE_AUTH_TOKEN (or CONSOLE_BASIC_USER and CONSOLE_BASIC_PASSWORD) to serve it, or bind 127.0.0.1", addr)
}

// Require answers 401 to every request without the credential; /healthz and /readyz stay open
// for probes (they say nothing about any tournament). Without a credential it lets all through.
func (a Auth) Require(next http.Handler) http.Handler {
	if !a.configured() {
		return next
	}
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path == "/healthz" || r.URL.Path == "/readyz" || a.allows(r) {
			next.ServeHTTP(w, r)
			return
		}
		w.Header().Set("WWW-Authenticate", `Basic realm="podium console", charset="UTF-8"`)
		http.Error(w, "401 unauthorized: this console needs its token (Authorization: Bearer, or as the basic-auth password)", http.StatusUnauthorized)
	})
}

func (a Auth) allows(r *http.Request) bool {
	if tok, ok := strings.CutPrefix(r.Header.Get("Authorization"), "Bearer "); ok && a.Token != "" {
		return same(tok, a.Token)
	}
	user, pw, ok := r.BasicAuth()
	if !ok {
		return false
	}
	if a.Token != "" && same(pw, a.Token) {
		return true
	}
	return a.BasicUser != "" && same(user, a.BasicUser) && same(pw, a.BasicPW)
}

// same compares in constant time, whatever the lengths (hashes first).
func same(a, b string) bool {
	ha, hb := sha256.Sum256([]byte(a)), sha256.Sum256([]byte(b))
	return subtle.ConstantTimeCompare(ha[:], hb[:]) == 1
}
