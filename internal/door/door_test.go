package door

import (
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
)

func TestLoopback(t *testing.T) {
	for _, tt := range []struct {
		addr string
		want bool
	}{
		{"127.0.0.1:8090", true},
		{"127.3.4.5:8090", true},
		{"[::1]:8090", true},
		{"localhost:8090", true},
		{":8090", false},
		{"0.0.0.0:8090", false},
		{"[::]:8090", false},
		{"10.0.0.7:8090", false},
		{"console.internal:8090", false},
		{"no-port", false},
	} {
		if got := Loopback(tt.addr); got != tt.want {
			t.Errorf("Loopback(%q) = %v, want %v", tt.addr, got, tt.want)
		}
	}
}

func TestCheckBind(t *testing.T) {
	if err := (Door{TokenVar: "CONSOLE_AUTH_TOKEN"}).CheckBind("0.0.0.0:8090"); err == nil || !strings.Contains(err.Error(), "CONSOLE_AUTH_TOKEN") {
		t.Errorf("an open bind without a credential: %v", err)
	}
	for _, d := range []Door{{Token: "t"}, {BasicUser: "u", BasicPW: "p"}} {
		if err := d.CheckBind("0.0.0.0:8090"); err != nil {
			t.Errorf("CheckBind with %+v: %v", d, err)
		}
	}
	if err := (Door{}).CheckBind("127.0.0.1:8090"); err != nil {
		t.Errorf("loopback without a credential: %v", err)
	}
	if err := (Door{BasicUser: "u"}).Validate(); err == nil {
		t.Error("a basic-auth user without a password was accepted")
	}
}

func TestGuard(t *testing.T) {
	ok := http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) { w.WriteHeader(http.StatusOK) })
	token := Door{Token: "s3cret"}.Guard("0.0.0.0:8082")(ok)
	pair := Door{BasicUser: "ann", BasicPW: "pw"}.Guard("127.0.0.1:8082")(ok)
	open := Door{TokenVar: "RANKER_API_TOKEN"}.Guard(":8082")(ok)
	local := Door{}.Guard("127.0.0.1:8082")(ok)
	host := func(h string) func(r *http.Request) { return func(r *http.Request) { r.Host = h } }
	for _, tt := range []struct {
		name    string
		h       http.Handler
		path    string
		prepare func(r *http.Request)
		want    int
	}{
		{"beyond loopback without a credential: refused", open, "/v1/executions/x/leaderboard", func(*http.Request) {}, http.StatusForbidden},
		{"beyond loopback without a credential: probes open", open, "/readyz", func(*http.Request) {}, http.StatusOK},
		{"beyond loopback without a credential: metrics open", open, "/metrics", func(*http.Request) {}, http.StatusOK},
		{"loopback, localhost", local, "/v1/x", host("localhost:8082"), http.StatusOK},
		{"loopback, 127.0.0.1", local, "/v1/x", host("127.0.0.1:8082"), http.StatusOK},
		{"loopback, [::1]", local, "/v1/x", host("[::1]:8082"), http.StatusOK},
		{"loopback, a rebound DNS name", local, "/v1/x", host("attacker.example:8082"), http.StatusForbidden},
		{"loopback, a rebound DNS name, probes open", local, "/healthz", host("attacker.example:8082"), http.StatusOK},
		{"no credential", token, "/", func(*http.Request) {}, http.StatusUnauthorized},
		{"bearer", token, "/", func(r *http.Request) { r.Header.Set("Authorization", "Bearer s3cret") }, http.StatusOK},
		{"wrong bearer", token, "/", func(r *http.Request) { r.Header.Set("Authorization", "Bearer s3cre") }, http.StatusUnauthorized},
		{"token as basic password", token, "/", func(r *http.Request) { r.SetBasicAuth("anyone", "s3cret") }, http.StatusOK},
		{"metrics stay open", token, "/metrics", func(*http.Request) {}, http.StatusOK},
		{"probes stay open", token, "/readyz", func(*http.Request) {}, http.StatusOK},
		{"basic pair", pair, "/", func(r *http.Request) { r.SetBasicAuth("ann", "pw") }, http.StatusOK},
		{"basic pair, wrong user", pair, "/", func(r *http.Request) { r.SetBasicAuth("bob", "pw") }, http.StatusUnauthorized},
		{"basic pair, bearer of its password", pair, "/", func(r *http.Request) { r.Header.Set("Authorization", "Bearer pw") }, http.StatusUnauthorized},
	} {
		t.Run(tt.name, func(t *testing.T) {
			r := httptest.NewRequest(http.MethodGet, tt.path, nil)
			tt.prepare(r)
			w := httptest.NewRecorder()
			tt.h.ServeHTTP(w, r)
			if w.Code != tt.want {
				t.Fatalf("status %d, want %d", w.Code, tt.want)
			}
			if w.Code == http.StatusUnauthorized && w.Header().Get("WWW-Authenticate") == "" {
				t.Error("a 401 without WWW-Authenticate: a browser would not ask for the credential")
			}
			if w.Code >= 400 {
				// The contract's error body: {"code", "message"}, as JSON.
				var e struct{ Code, Message string }
				if err := json.Unmarshal(w.Body.Bytes(), &e); err != nil || e.Code == "" || e.Message == "" || w.Header().Get("Content-Type") != "application/json" {
					t.Errorf("a %d with body %q (%s): want {\"code\", \"message\"}", w.Code, w.Body, w.Header().Get("Content-Type"))
				}
			}
		})
	}
}
