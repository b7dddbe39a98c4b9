package e2e

import (
	"net"
	"net/http"
	"strings"
	"testing"
)

// TestDataAPIsBehindTheDoor: the ranker's history and the composer's render serve submissions.
// Bound beyond loopback without a token they answer 403 (probes and metrics stay open); with a
// token, 401 without it and 200 with it; bound to loopback without one, a request to another
// host name (DNS rebinding) gets 403.
func TestDataAPIsBehindTheDoor(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	anyIface := func(name string, extra ...string) *proc {
		_, port, _ := net.SplitHostPort(freeAddr(t))
		p := e.spawn(name, append([]string{"HTTP_ADDR=0.0.0.0:" + port}, extra...)...)
		p.addr = "127.0.0.1:" + port
		p.waitOK(t, "http://"+p.addr+"/readyz")
		return p
	}
	open := anyIface("ranker")
	tokened := anyIface("ranker", "RANKER_API_TOKEN=s3cret")
	composer := anyIface("composer")
	local := e.start("ranker")
	e.publishEvaluation("ev-door", evaluation("door", "t1", "Team t1", 1, 50, "secret work", t0))
	waitCommitted(t, e, 1)

	const history = "/v1/executions/door/teams/t1/history"
	for _, tt := range []struct {
		name, url, method, host, auth string
		want                          int
	}{
		{"beyond loopback, no token: the history", "http://" + open.addr + history, "GET", "", "", http.StatusForbidden},
		{"beyond loopback, no token: readyz", "http://" + open.addr + "/readyz", "GET", "", "", http.StatusOK},
		{"beyond loopback, no token: metrics", "http://" + open.addr + "/metrics", "GET", "", "", http.StatusOK},
		{"beyond loopback, no token: render", "http://" + composer.addr + "/v1/render", "POST", "", "", http.StatusForbidden},
		{"a token: none sent", "http://" + tokened.addr + history, "GET", "", "", http.StatusUnauthorized},
		{"a token: the wrong one", "http://" + tokened.addr + history, "GET", "", "Bearer nope", http.StatusUnauthorized},
		{"a token: sent", "http://" + tokened.addr + history, "GET", "", "Bearer s3cret", http.StatusOK},
		{"loopback: to localhost", "http://" + local.addr + history, "GET", "localhost", "", http.StatusOK},
		{"loopback: to a rebound name", "http://" + local.addr + history, "GET", "attacker.example", "", http.StatusForbidden},
	} {
		req, err := http.NewRequest(tt.method, tt.url, strings.NewReader("{}"))
		if err != nil {
			t.Fatal(err)
		}
		if tt.host != "" {
			req.Host = tt.host
		}
		if tt.auth != "" {
			req.Header.Set("Authorization", tt.auth)
		}
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if resp.StatusCode != tt.want {
			t.Errorf("%s: %s %s: %d, want %d", tt.name, tt.method, tt.url, resp.StatusCode, tt.want)
		}
	}
	if lines := logLines(open, "HTTP_ADDR is beyond loopback and RANKER_API_TOKEN is not set"); len(lines) != 1 {
		t.Errorf("the ranker bound beyond loopback without a token logged %d warnings, want 1", len(lines))
	}
}
