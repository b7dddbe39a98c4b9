package service

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/url"
	"strings"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/podium-llm/podium/internal/retry"
	"github.com/podium-llm/podium/internal/secrets"
	"github.com/podium-llm/podium/pkg/events"
)

// NATS is how a service reaches NATS.
type NATS struct {
	NATSURL      string `envconfig:"NATS_URL" default:"nats://127.0.0.1:4222" desc:"comma-separated NATS server URLs"`
	NATSCreds    string `envconfig:"NATS_CREDS" desc:"NATS credentials file (JWT + nkey)"`
	NATSUser     string `envconfig:"NATS_USER" desc:"NATS user"`
	NATSPassword string `envconfig:"NATS_PASSWORD" desc:"NATS password"`
	NATSTLSCA    string `envconfig:"NATS_TLS_CA" desc:"CA certificate file for NATS TLS"`
	// NATSConnectWait is how long a service starting waits for a server to answer (NATS
	// restarting as it starts), trying again with the shared backoff; 0: not at all.
	NATSConnectWait time.Duration `envconfig:"NATS_CONNECT_WAIT" default:"60s" desc:"how long a service starting waits for a NATS server to answer before it gives up (0: it does not wait)"`
}

// As is how a service's second connection, the one that answers requests, reaches NATS: as the
// service does, under its own credentials file or user when one is set.
func (c NATS) As(creds, user, password string) *NATS {
	switch {
	case creds != "":
		c.NATSCreds, c.NATSUser, c.NATSPassword = creds, "", ""
	case user != "":
		c.NATSCreds, c.NATSUser, c.NATSPassword = "", user, password
	default:
		return &c
	}
	// Credentials in NATS_URL would win over the API user's (nats.go prefers a URL's userinfo).
	c.NATSURL = StripUserinfo(c.NATSURL)
	return &c
}

// DrainQuietly drains a service's second connection (the one that answers requests) once its
// answers in flight were published, before the main connection: quietly, since the disconnect
// that closes it is the stop itself, not a warning.
func DrainQuietly(nc *nats.Conn) {
	nc.SetDisconnectErrHandler(nil)
	nc.SetClosedHandler(nil)
	_ = nc.Drain()
}

// Validate checks the URLs; prefix is the service's, for the messages.
func (c *NATS) Validate(prefix string) error {
	if err := checkNATSURLs(c.NATSURL); err != nil {
		return fmt.Errorf("%s: %w", variable("NATS_URL", prefix), err)
	}
	if c.NATSConnectWait < 0 {
		return fmt.Errorf("%s must not be negative, got %s", variable("NATS_CONNECT_WAIT", prefix), c.NATSConnectWait)
	}
	return nil
}

// ConnectNATS connects with the configured credentials and reconnects forever afterwards; the
// connection state is logged and reflected in readiness.
func ConnectNATS(c *NATS, name string, log *slog.Logger) (*nats.Conn, error) {
	opts := []nats.Option{
		nats.Name(name),
		nats.MaxReconnects(-1),
		nats.ReconnectWait(time.Second),
		nats.DisconnectErrHandler(func(_ *nats.Conn, err error) {
			log.Warn("nats disconnected", "error", err)
		}),
		nats.ReconnectHandler(func(nc *nats.Conn) {
			log.Info("nats reconnected", "url", nc.ConnectedUrlRedacted())
		}),
		// The server's refusals (a permission this user lacks) and slow consumers come back
		// asynchronously: said, not dropped, so a denied subject is named in the log.
		nats.ErrorHandler(func(_ *nats.Conn, sub *nats.Subscription, err error) {
			subject := ""
			if sub != nil {
				subject = sub.Subject
			}
			log.Error("nats refused or dropped something", "error", err, "subscription", subject)
		}),
	}
	if c.NATSCreds != "" {
		opts = append(opts, nats.UserCredentials(c.NATSCreds))
	}
	if c.NATSUser != "" {
		opts = append(opts, nats.UserInfo(c.NATSUser, c.NATSPassword))
	}
	if c.NATSTLSCA != "" {
		opts = append(opts, nats.RootCAs(c.NATSTLSCA))
	}
	nc, err := nats.Connect(c.NATSURL, opts...)
	if err != nil {
		return nil, &connectError{msg: fmt.Sprintf("connect nats %s: %s", RedactURLs(c.NATSURL), RedactURLs(err.Error())), err: err}
	}
	return nc, nil
}

// Connect connects as ConnectNATS does, waiting out a server that does not answer (NATS restarting
// as the service starts) with the shared backoff for NATS_CONNECT_WAIT; any other failure
// (credentials, TLS) ends it at once.
func Connect(ctx context.Context, c *NATS, name string, log *slog.Logger) (*nats.Conn, error) {
	var nc *nats.Conn
	var last error // the last try's, to say when the wait is over
	wait, cancel := context.WithTimeout(ctx, c.NATSConnectWait)
	defer cancel()
	err := retry.Do(wait, retry.Redelivery(), func(try uint64, err error, pause time.Duration) {
		log.Warn("no NATS server answers; trying again before starting", "error", err, "try", try, "retry_in", pause.String())
	}, func(context.Context, uint64) error {
		if nc, last = ConnectNATS(c, name, log); last != nil && (!errors.Is(last, nats.ErrNoServers) || c.NATSConnectWait == 0) {
			return retry.Stop(last)
		}
		return last
	})
	if err != nil {
		if ctx.Err() == nil && wait.Err() != nil {
			return nil, fmt.Errorf("%w (no server answered within NATS_CONNECT_WAIT, %s)", last, c.NATSConnectWait)
		}
		return nil, err
	}
	return nc, nil
}

// connectError is a failed connection, said without the credentials a URL may carry; it unwraps
// to nats.go's error (nats.ErrNoServers: no server answered).
type connectError struct {
	msg string
	err error
}

func (e *connectError) Error() string { return e.msg }
func (e *connectError) Unwrap() error { return e.err }

// natsSchemes are the URL schemes nats.go connects with.
var natsSchemes = map[string]bool{"nats": true, "tls": true, "ws": true, "wss": true}

// checkNATSURLs accepts a comma-separated list of nats://, tls://, ws:// or wss:// URLs with a
// host, so a typo is a configuration error naming the variable, not a DNS lookup.
func checkNATSURLs(list string) error {
	if strings.TrimSpace(list) == "" {
		return errors.New("must not be empty")
	}
	for _, raw := range strings.Split(list, ",") {
		raw = strings.TrimSpace(raw)
		if !strings.Contains(raw, "://") {
			if _, _, err := net.SplitHostPort(raw); err != nil {
				return fmt.Errorf("%s is neither a nats://, tls://, ws:// or wss:// URL nor host:port (like nats://127.0.0.1:4222)", events.Quote(RedactURLs(raw)))
			}
			raw = "nats://" + raw // host:port, as nats.go accepts it
		}
		u, err := url.Parse(raw)
		if err != nil || !natsSchemes[u.Scheme] || u.Host == "" {
			return fmt.Errorf("%s is not a nats://, tls://, ws:// or wss:// URL with a host (like nats://127.0.0.1:4222)", events.Quote(RedactURLs(raw)))
		}
	}
	return nil
}

// RedactURLs replaces passwords in the URLs of a text with "xxxxx" where a message is made (the
// process's output redacts every known secret again: internal/secrets).
func RedactURLs(s string) string { return secrets.RedactURLs(s) }

// NATSConnected is the readiness probe of a NATS connection.
func NATSConnected(nc *nats.Conn) func(context.Context) error {
	return func(context.Context) error {
		if !nc.IsConnected() {
			return fmt.Errorf("nats %s", nc.Status())
		}
		return nil
	}
}

// StripUserinfo removes the credentials of every URL of a comma-separated list, so a connection
// authenticates with the user or credentials file it is given instead.
func StripUserinfo(list string) string {
	urls := strings.Split(list, ",")
	for i, raw := range urls {
		raw = strings.TrimSpace(raw)
		scheme, rest, ok := strings.Cut(raw, "://")
		prefix := scheme + "://"
		if !ok {
			prefix, rest = "", raw // host:port, with user:password@ before it as nats.go takes it
		}
		// Up to the last "@": a password may hold "/" or "@" (NATS URLs have no path).
		if at := strings.LastIndexByte(rest, '@'); at >= 0 {
			urls[i] = prefix + rest[at+1:]
		}
	}
	return strings.Join(urls, ",")
}
