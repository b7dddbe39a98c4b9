// Package secrets keeps the secrets a process was given out of everything it prints. A secret is
// known by where it is, not by what it looks like: the value of every variable named *_PASSWORD,
// *_TOKEN, *_SECRET or *_PASS, the password of every URL in any variable (whatever its characters)
// and the token of a NATS URL, the headers of OTEL_EXPORTER_OTLP_HEADERS, and the lines of the NATS
// credentials file. The one place they are taken out is the process's standard output and error
// and the log package's output (internal/process wraps them), so logs at every level,
// configuration errors, --help and recovered panics are covered alike; on standard error a URL's
// password is also masked by position, in texts that never held a known secret (RedactURLs).
package secrets

import (
	"bytes"
	"encoding/json"
	"io"
	"net/url"
	"os"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"sync"
)

// Mask is what a secret is printed as.
const Mask = "xxxxx"

// minLen is the shortest secret replaced wherever it appears: a shorter one would mask ordinary
// text (every "a" of a log). Shorter passwords are still masked where their place says so (a URL).
const minLen = 4

// maxCredsFile is the most of a credentials file read for its secrets.
const maxCredsFile = 1 << 20

// secretSuffixes name the variables whose whole value is a secret.
var secretSuffixes = []string{"_PASSWORD", "_TOKEN", "_SECRET", "_PASS"}

// Redactor replaces known secrets, in every form they may be printed in, by Mask.
type Redactor struct {
	r *strings.Replacer
}

// FromEnv finds the secrets of an environment (os.Environ()'s form), and those of the NATS
// credentials file NATS_CREDS (or a prefixed *_NATS_CREDS) names when readCreds is set.
func FromEnv(environ []string, readCreds bool) *Redactor {
	var found []string
	for _, kv := range environ {
		name, value, ok := strings.Cut(kv, "=")
		if !ok || value == "" {
			continue
		}
		upper := strings.ToUpper(name)
		switch {
		case slices.ContainsFunc(secretSuffixes, func(s string) bool { return strings.HasSuffix(upper, s) }):
			found = append(found, value)
		case strings.HasSuffix(upper, "OTEL_EXPORTER_OTLP_HEADERS"), strings.HasSuffix(upper, "OTEL_EXPORTER_OTLP_TRACES_HEADERS"):
			// Each header's value, and the list whole (a value may hold the separator).
			found = append(append(found, value), headerValues(value)...)
		case strings.HasSuffix(upper, "NATS_CREDS") && readCreds:
			found = append(found, credsLines(value)...)
		}
		found = append(found, urlPasswords(value, strings.HasSuffix(upper, "NATS_URL"))...)
	}
	return New(found...)
}

// New is a Redactor of the given secrets.
func New(secrets ...string) *Redactor {
	seen := map[string]bool{}
	var forms []string
	for _, s := range secrets {
		for _, f := range printedForms(s) {
			if len(f) >= minLen && !seen[f] {
				seen[f] = true
				forms = append(forms, f)
			}
		}
	}
	// Longest first: a secret that contains another is masked whole.
	slices.SortFunc(forms, func(a, b string) int { return len(b) - len(a) })
	pairs := make([]string, 0, 2*len(forms))
	for _, f := range forms {
		pairs = append(pairs, f, Mask)
	}
	return &Redactor{r: strings.NewReplacer(pairs...)}
}

// printedForms are the ways a secret may appear in output: as it is, quoted by %q, escaped in a
// JSON string (a log line) with and without HTML escaping, each of those in a JSON string again (an
// error quoting it, logged), and escaped in a URL.
func printedForms(s string) []string {
	forms := []string{s, url.QueryEscape(s), url.PathEscape(s), url.UserPassword("u", s).String()[2:]}
	quoted := strconv.Quote(s)
	forms = append(forms, quoted[1:len(quoted)-1])
	for _, base := range []string{s, quoted[1 : len(quoted)-1]} {
		for _, html := range []bool{true, false} {
			forms = append(forms, jsonEscaped(base, html))
		}
	}
	for _, html := range []bool{true, false} {
		forms = append(forms, jsonEscaped(jsonEscaped(s, html), html))
	}
	// A decoded form too, when the secret was given percent-encoded (a URL's password).
	if d, err := url.PathUnescape(s); err == nil {
		forms = append(forms, d)
	}
	return forms
}

// jsonEscaped is s as it appears inside a JSON string.
func jsonEscaped(s string, html bool) string {
	var b bytes.Buffer
	enc := json.NewEncoder(&b)
	enc.SetEscapeHTML(html)
	if enc.Encode(s) != nil {
		return s
	}
	return strings.TrimSuffix(strings.TrimSuffix(strings.TrimPrefix(b.String(), `"`), "\n"), `"`)
}

// String is s with every known secret masked, and every URL's password.
func (r *Redactor) String(s string) string { return RedactURLs(r.r.Replace(s)) }

// Writer is w with every write redacted: known secrets and every URL's password (standard error:
// logs, errors). A write is redacted whole, so a secret is found when one write holds it: every line
// the process prints is one write (slog's handlers, fmt.Fprintln, the log package).
func (r *Redactor) Writer(w io.Writer) io.Writer { return &writer{redact: r.String, w: w} }

// ValuesWriter is w with the known secrets masked only (standard output: what a command prints,
// prompts included, whose text a URL's password by position would change).
func (r *Redactor) ValuesWriter(w io.Writer) io.Writer { return &writer{redact: r.r.Replace, w: w} }

type writer struct {
	mu     sync.Mutex
	redact func(string) string
	w      io.Writer
}

func (w *writer) Write(p []byte) (int, error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	if _, err := io.WriteString(w.w, w.redact(string(p))); err != nil {
		return 0, err
	}
	return len(p), nil
}

// userinfo matches the user:password@ of a URL in a text: the password runs to the last "@" before
// the next blank, comma, quote or "/", so one holding ":", "@" or "?" is masked whole (a password
// holding "/" the process was given is masked by its value; by position, "host:443/@scope" is a
// port and a path, not a password). token matches a URL's userinfo without a password: a token.
var (
	userinfo = regexp.MustCompile(`([a-zA-Z][a-zA-Z0-9+.-]*://[^/@\s:,"']*):[^\s,"'/]*@`)
	token    = regexp.MustCompile(`([a-zA-Z][a-zA-Z0-9+.-]*://)[^/@\s:,"']+@`)
)

// RedactURLs masks the password, or the token, of every URL in s.
func RedactURLs(s string) string {
	return token.ReplaceAllString(userinfo.ReplaceAllString(s, "$1:"+Mask+"@"), "${1}"+Mask+"@")
}

// urlPasswords are the passwords of the URLs in a variable's value (a comma-separated list, as
// NATS_URL is), raw as written and decoded; with tokens, a userinfo without a password too (NATS
// takes nats://TOKEN@host; elsewhere it is a user name, which masked everywhere would mask words).
func urlPasswords(value string, tokens bool) []string {
	var out []string
	// Each URL of the list, and the value whole: a password holding a comma or a blank (which a
	// list would need written %2C, %20) is still a password.
	for _, raw := range append(strings.Split(value, ","), value) {
		raw = strings.TrimSpace(raw)
		_, rest, ok := strings.Cut(raw, "://")
		if !ok {
			continue
		}
		at := strings.LastIndex(rest, "@")
		if at < 0 {
			continue
		}
		switch user, pass, ok := strings.Cut(rest[:at], ":"); {
		case ok && pass != "":
			out = append(out, pass)
		case !ok && user != "" && tokens:
			out = append(out, user) // a token
		}
	}
	return out
}

// headerValues are the values of a key1=value1,key2=value2 list (OTLP's headers).
func headerValues(value string) []string {
	var out []string
	for _, h := range strings.Split(value, ",") {
		if _, v, ok := strings.Cut(h, "="); ok {
			out = append(out, strings.TrimSpace(v))
		}
	}
	return out
}

// credsLines are the secret lines of a NATS credentials file: its JWT and its seed.
func credsLines(path string) []string {
	f, err := os.Open(path)
	if err != nil {
		return nil // the service says so when it connects
	}
	defer f.Close()
	b, err := io.ReadAll(io.LimitReader(f, maxCredsFile))
	if err != nil {
		return nil
	}
	var out []string
	for _, line := range strings.Split(string(b), "\n") {
		line = strings.TrimSpace(line)
		if len(line) >= 16 && !strings.HasPrefix(line, "-") && !strings.HasPrefix(line, "*") {
			out = append(out, line)
		}
	}
	return out
}
