package secrets

import (
	"bytes"
	"encoding/json"
	"fmt"
	"log/slog"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// specials are the characters a password may hold that mean something in a URL, a JSON string, a
// shell or a list.
const specials = "/?#@:%&=+$,; []'\"\\<>!*(){}|^`~"

// TestEveryPrintedFormIsMasked: a secret of each kind of variable, holding each special character,
// is masked in every form the output may carry it: as written, in a JSON log line (slog's), in
// a URL, percent-encoded, in an error.
func TestEveryPrintedFormIsMasked(t *testing.T) {
	dir := t.TempDir()
	for i, ch := range specials {
		marker := func(kind string) string { return fmt.Sprintf("MARK%s%d", kind, i) }
		pw := func(kind string) string { return "zq" + string(ch) + "Kx7" + string(ch) + marker(kind) }
		creds := filepath.Join(dir, fmt.Sprintf("%d.creds", i))
		seed := "SUAMK2FG4MI6UE3ACF3FK3OIQBCEIEZV7NSWFFEW63UXMRLFM2XLAXK4GY" + marker("Seed")
		if err := os.WriteFile(creds, []byte("-----BEGIN USER NKEY SEED-----\n"+seed+"\n------END USER NKEY SEED------\n"), 0o600); err != nil {
			t.Fatal(err)
		}
		environ := []string{
			"NATS_URL=nats://ranker:" + pw("Url") + "@127.0.0.1:1,nats://other:" + pw("Url2") + "@h:2",
			"NATS_PASSWORD=" + pw("Nats"), "COMPOSER_CLICKHOUSE_PASSWORD=" + pw("Ch"), "CONSOLE_TOKEN=" + pw("Token"),
			"OTEL_EXPORTER_OTLP_HEADERS=Authorization=Bearer " + pw("Otel"), "NATS_CREDS=" + creds,
			"OTEL_EXPORTER_OTLP_ENDPOINT=https://u:" + pw("Endpoint") + "@collector:4318",
		}
		r := FromEnv(environ, true)
		var out bytes.Buffer
		log := slog.New(slog.NewJSONHandler(r.Writer(&out), nil))
		for _, kv := range environ {
			_, v, _ := strings.Cut(kv, "=")
			log.Info("config", "value", v, "escaped", url.QueryEscape(v))
			fmt.Fprintln(r.Writer(&out), "error:", v, fmt.Errorf("connect %q: %w", v, os.ErrNotExist))
			log.Error("failed", "error", fmt.Errorf("connect %q", v)) // quoted, then escaped again
			b, _ := json.Marshal(map[string]string{"v": v})
			r.Writer(&out).Write(b)
		}
		log.Info("seed", "line", seed)
		if strings.Contains(out.String(), "MARK") {
			t.Errorf("a secret holding %q leaked:\n%s", ch, out.String())
		}
		if !strings.Contains(out.String(), Mask) {
			t.Errorf("nothing masked for %q", ch)
		}
	}
}

// TestURLPasswordsByPosition: a URL's password (or token) is masked even when the process was not
// given it (a URL in a library's error), whatever its characters but "/", which would make a port
// and a path a password (a password with "/" the process was given is masked by its value).
func TestURLPasswordsByPosition(t *testing.T) {
	for _, c := range []struct{ in, want string }{
		{"connect nats://ranker:pa:s?s@host:4222: refused", "connect nats://ranker:xxxxx@host:4222: refused"},
		{"nats://a:b@c@d:1, tls://e:f:g@h:2", "nats://a:xxxxx@d:1, tls://e:xxxxx@h:2"},
		{`"wss://u:p?q#r@h"`, `"wss://u:xxxxx@h"`},
		{"no url here: a:b@c", "no url here: a:b@c"},
		{"nats://s3cr3tToken@host:4222", "nats://xxxxx@host:4222"},
		{"https://registry.npmjs.org:443/@scope/pkg", "https://registry.npmjs.org:443/@scope/pkg"},
	} {
		if got := RedactURLs(c.in); got != c.want {
			t.Errorf("RedactURLs(%q) = %q, want %q", c.in, got, c.want)
		}
	}
}

// TestShortSecretsAreNotMaskedEverywhere: a secret shorter than minLen is not masked in ordinary
// text (it would mask every word holding it), but still where a URL puts it.
func TestShortSecretsAreNotMaskedEverywhere(t *testing.T) {
	r := FromEnv([]string{"NATS_PASSWORD=ab", "NATS_URL=nats://u:ab@h:1"}, false)
	if got := r.String("absent; nats://u:ab@h:1"); got != "absent; nats://u:xxxxx@h:1" {
		t.Errorf("got %q", got)
	}
}

// TestTokensOfNATSURLsOnly: a NATS URL's userinfo without a password is a token, masked wherever it
// appears; in another variable it is a user name, masked only in its URL (on standard error).
func TestTokensOfNATSURLsOnly(t *testing.T) {
	r := FromEnv([]string{"NATS_URL=nats://s3cr3tTOKEN@h:4222", "CLICKHOUSE_URL=clickhouse://default@ch:9000"}, false)
	if got := r.String("token s3cr3tTOKEN, user default"); got != "token xxxxx, user default" {
		t.Errorf("got %q", got)
	}
}
