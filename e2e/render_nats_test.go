package e2e

import (
	"bytes"
	"encoding/json"
	"io"
	"net/http"
	"strconv"
	"testing"
	"time"

	"github.com/nats-io/nats.go/micro"
)

// TestRenderOverNATS: podium.render, the composer's micro service, answers the same body with the
// same bytes as POST /v1/render, errors included (with the micro error headers), and is
// discoverable with $SRV.PING and $SRV.INFO.
func TestRenderOverNATS(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	e.start("ranker")
	composer := e.start("composer")
	e.publishEvaluation("ev-1", evaluation("nr", "t1", "One", 1, 70, "first answer <b>&</b>", t0))
	for _, tt := range []struct {
		name, body string
		status     int
	}{
		{"composed", `{"execution_id":"nr","team_id":"t1","team_name":"One","round_number":2,"user_prompt":"Go <on>.","time":"2026-11-21T11:00:00Z","request_id":"r1"}`, http.StatusOK},
		{"unknown template", `{"execution_id":"nr","team_id":"t1","team_name":"One","round_number":2,"user_prompt":"Go.","template":"nope"}`, http.StatusUnprocessableEntity},
		{"invalid", `{"execution_id":"nr"}`, http.StatusBadRequest},
	} {
		resp, err := http.Post("http://"+composer.addr+"/v1/render", "application/json", bytes.NewReader([]byte(tt.body)))
		if err != nil {
			t.Fatal(err)
		}
		viaHTTP, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		msg, err := e.nc.Request("podium.render", []byte(tt.body), 10*time.Second)
		if err != nil {
			t.Fatalf("%s: request podium.render: %v", tt.name, err)
		}
		if resp.StatusCode != tt.status || !bytes.Equal(viaHTTP, msg.Data) {
			t.Errorf("%s: HTTP %d %s\nNATS %s", tt.name, resp.StatusCode, viaHTTP, msg.Data)
		}
		code := msg.Header.Get(micro.ErrorCodeHeader)
		want := strconv.Itoa(tt.status)
		if tt.status == http.StatusOK {
			want = ""
		}
		if code != want {
			t.Errorf("%s: micro error code header %q, want %q", tt.name, code, want)
		}
	}
	ping, err := e.nc.Request("$SRV.PING.podium", nil, 5*time.Second)
	if err != nil {
		t.Fatalf("$SRV.PING.podium: %v", err)
	}
	info, err := e.nc.Request("$SRV.INFO.podium", nil, 5*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	var got micro.Info
	// render, and parse (docs/builders.md), in the order they were added.
	if err := json.Unmarshal(info.Data, &got); err != nil || got.Name != "podium" || len(got.Endpoints) != 2 || got.Endpoints[0].Subject != "podium.render" || got.Endpoints[0].Name != "render" ||
		got.Endpoints[1].Subject != "podium.parse" || got.Endpoints[1].Name != "parse" {
		t.Errorf("$SRV.INFO.podium = %s (ping %s)", info.Data, ping.Data)
	}
}
