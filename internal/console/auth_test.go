package console

import (
	"net/http"
	"net/http/httptest"
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
	if err := CheckBind("0.0.0.0:8090", Auth{}); err == nil {
		t.Error("an open bind without a credential was accepted")
	}
	for _, a := range []Auth{{Token: "t"}, {BasicUser: "u", BasicPW: "p"}} {
		if err := CheckBind("0.0.0.0:8090", a); err != nil {
			t.Errorf("CheckBind with %+v: %v", a, err)
		}
	}
	if err := CheckBind("127.0.0.1:8090", Auth{}); err != nil {
		t.Errorf("loopback without a credential: %v", err)
	}
	if err := (Auth{BasicUser: "u"}).Validate(); err == nil {
		t.Error("a basic-auth user without a password was accepted")
	}
}

func TestRequire(t *testing.T) {
	ok := http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) { w.WriteHeader(http.StatusOK) })
	token := Auth{Token: "s3cret"}.Require(ok)
	pair := Auth{BasicUser: "ann", BasicPW: "pw"}.Require(ok)
	for _, tt := range []struct {
		name    string
		h       http.Handler
		path    string
		prepare func(r *http.Request)
		want    int
	}{
		{"no credential", token, "/", func(*http.Request) {}, http.StatusUnauthorized},
		{"bearer", token, "/", func(r *http.Request) { r.Header.Set("Authorization", "Bearer s3cret") }, http.StatusOK},
		{"wrong bearer", token, "/", func(r *http.Request) { r.Header.Set("Authorization", "Bearer s3cre") }, http.StatusUnauthorized},
		{"token as basic password", token, "/", func(r *http.Request) { r.SetBasicAuth("anyone", "s3cret") }, http.StatusOK},
		{"metrics need it too", token, "/metrics", func(*http.Request) {}, http.StatusUnauthorized},
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
		})
	}
}

func TestSecureRefusesWritesAndSetsCSP(t *testing.T) {
	h := secure(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) { w.WriteHeader(http.StatusOK) }))
	for _, method := range []string{http.MethodPost, http.MethodPut, http.MethodDelete, http.MethodPatch} {
		w := httptest.NewRecorder()
		h.ServeHTTP(w, httptest.NewRequest(method, "/", nil))
		if w.Code != http.StatusMethodNotAllowed {
			t.Errorf("%s answered %d, want 405", method, w.Code)
		}
	}
	w := httptest.NewRecorder()
	h.ServeHTTP(w, httptest.NewRequest(http.MethodGet, "/", nil))
	if got := w.Header().Get("Content-Security-Policy"); got != contentSecurityPolicy {
		t.Errorf("CSP %q", got)
	}
	if w.Header().Get("X-Content-Type-Options") != "nosniff" {
		t.Error("no nosniff")
	}
}
